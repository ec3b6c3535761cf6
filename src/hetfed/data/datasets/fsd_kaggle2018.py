"""``fsd_kaggle2018``: FSD Kaggle 2018's 41 sound classes from its published CSVs and audio folders."""

from __future__ import annotations

import numpy as np

from hetfed.config import DatasetConfig
from hetfed.data import audio
from hetfed.data.datasets import DatasetKind, register
from hetfed.data.loading import Dataset, candidates, file_record
from hetfed.errors import DataError


def load_fsd_kaggle2018(cfg: DatasetConfig) -> Dataset:
    """FSD Kaggle 2018 (41 sound classes) from its published CSVs and audio folders; x holds the clips' paths."""
    looked = candidates("fsd_kaggle2018", cfg.data_dir)
    found = next((paths for folder in looked if (paths := audio.find_layout(folder)) is not None), None)
    if found is None:
        layouts = "; or ".join(" + ".join(layout) for layout in audio.LAYOUTS)
        where = ", ".join(str(p) for p in looked) or "nowhere (set dataset.data_dir)"
        raise DataError(f"dataset 'fsd_kaggle2018': expected {layouts}; looked in {where}. "
                        f"To get them: {audio.HOW_TO_GET}; then set dataset.data_dir to the folder.")
    train_csv, test_csv, train_audio, test_audio = found
    names_tr, labels_tr = audio.read_labels(train_csv)
    names_te, labels_te = audio.read_labels(test_csv)
    classes = tuple(sorted(set(labels_tr)))
    unknown = sorted(set(labels_te) - set(classes))
    if unknown:
        raise DataError(f"{test_csv} has labels {unknown[:5]} that the training CSV lacks: expected the same classes")
    index = {c: i for i, c in enumerate(classes)}
    return Dataset("fsd_kaggle2018", audio.clip_paths(train_audio, names_tr, train_csv),
                   np.array([index[c] for c in labels_tr], dtype=np.int64),
                   audio.clip_paths(test_audio, names_te, test_csv),
                   np.array([index[c] for c in labels_te], dtype=np.int64), len(classes), "audio",
                   sources=(file_record(train_csv), file_record(test_csv)), class_names=classes)


register(DatasetKind("fsd_kaggle2018", load_fsd_kaggle2018, "FSD Kaggle 2018: 41 sound classes (audio: x holds "
                     "the clips' paths; embed.kind yamnet)", "audio", how_to_get=audio.HOW_TO_GET))
