"""Audio: FSD Kaggle 2018 in its published layout, and WAV files read as 16 kHz mono.

FSDKaggle2018 (Fonseca et al., Zenodo record 2552860) unpacks to
``FSDKaggle2018.meta/train_post_competition.csv`` (``fname,label,…``),
``FSDKaggle2018.meta/test_post_competition_scoring_clips.csv`` and the folders
``FSDKaggle2018.audio_train/`` and ``FSDKaggle2018.audio_test/`` of 44.1 kHz
PCM WAVs; the Kaggle competition's ``train.csv`` + ``audio_train/`` (+ a
``test.csv`` with labels) is read too. 41 classes; the CGAU paper's task is
cough against everything else (``dataset.positive_class: Cough``).

The loader returns the clips' paths (x is an object array of paths): the audio is
read only by the extractor (``embed.kind: yamnet``), whose output is cached, so
nine thousand clips never sit in memory as waveforms.
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from hetfed.errors import DataError

#: (train CSV, test CSV, train audio, test audio), the Zenodo layout first
LAYOUTS = [
    ("FSDKaggle2018.meta/train_post_competition.csv", "FSDKaggle2018.meta/test_post_competition_scoring_clips.csv",
     "FSDKaggle2018.audio_train", "FSDKaggle2018.audio_test"),
    ("train_post_competition.csv", "test_post_competition_scoring_clips.csv", "audio_train", "audio_test"),
    ("train.csv", "test.csv", "audio_train", "audio_test"),
]
HOW_TO_GET = ("download FSDKaggle2018.audio_train.zip, FSDKaggle2018.audio_test.zip and FSDKaggle2018.meta.zip "
              "from https://zenodo.org/record/2552860 and unzip them into one folder")


def find_layout(folder: Path) -> tuple[Path, Path, Path, Path] | None:
    for layout in LAYOUTS:
        paths = tuple(folder / p for p in layout)
        if paths[0].is_file() and paths[1].is_file() and paths[2].is_dir() and paths[3].is_dir():
            return paths  # type: ignore[return-value]
    return None


def read_labels(csv_path: Path) -> tuple[list[str], list[str]]:
    """``(file names, labels)`` from a CSV with ``fname`` and ``label`` columns."""
    with csv_path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = {"fname", "label"} - set(reader.fieldnames or [])
        if missing:
            raise DataError(f"{csv_path} lacks the columns {sorted(missing)}: expected FSD Kaggle 2018's "
                            "fname,label,… header")
        rows = [(r["fname"], r["label"]) for r in reader]
    return [r[0] for r in rows], [r[1] for r in rows]


def clip_paths(audio: Path, names: list[str], csv_path: Path) -> np.ndarray:
    paths = [audio / n for n in names]
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        raise DataError(f"{len(missing)} clips listed in {csv_path} are not in {audio} (first: {missing[0]}): "
                        f"expected every listed WAV there; {HOW_TO_GET}")
    return np.array([str(p) for p in paths], dtype=object)


def read_wav(path: str | Path, rate: int = 16_000) -> np.ndarray:
    """A WAV file as float32 mono in [−1, 1] at ``rate`` Hz (channels averaged; polyphase resampling)."""
    from math import gcd

    from scipy.io import wavfile
    from scipy.signal import resample_poly

    try:
        source_rate, data = wavfile.read(path)
    except (ValueError, OSError) as err:
        raise DataError(f"{path} could not be read as WAV ({err}): expected a PCM or float WAV file") from None
    if np.issubdtype(data.dtype, np.integer):
        info = np.iinfo(data.dtype)
        if info.min == 0:  # 8-bit WAV is unsigned
            data = (data.astype(np.float32) - (info.max + 1) / 2) / ((info.max + 1) / 2)
        else:
            data = data.astype(np.float32) / -info.min
    data = np.asarray(data, dtype=np.float32)
    if data.ndim == 2:
        data = data.mean(axis=1)
    if source_rate != rate:
        g = gcd(int(source_rate), rate)
        data = resample_poly(data, rate // g, int(source_rate) // g).astype(np.float32)
    return data
