"""Named datasets: each loader gives train/test arrays, labels and optional client ids.

Images are returned as float32 in [0, 1] with shape N×H×W (grayscale) or
N×H×W×3 (colour); text as an object array of strings. The bundled default,
``digits``, works offline with nothing else installed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from hetfed.config import DatasetConfig
from hetfed.data.formats import read_ag_news_csv, read_arrays, read_cifar_batch, read_idx
from hetfed.errors import DataError


@dataclass(frozen=True, eq=False)
class Dataset:
    """Train/test arrays of one dataset, before embedding and partitioning."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    modality: str  # "image", "text" or "vector"
    client_train: np.ndarray | None = None  # natural client id per train sample

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(self.x_train.shape[1:])


def _split(x: np.ndarray, y: np.ndarray, fraction: float, seed: int = 0):
    """A fixed, stratified train/test split for data that ships without one."""
    from sklearn.model_selection import train_test_split

    return train_test_split(
        np.arange(len(y)), test_size=fraction, random_state=seed, stratify=y
    )


def load_digits_dataset(cfg: DatasetConfig) -> Dataset:
    """scikit-learn's bundled 8×8 digits; split 80/20 (stratified, fixed seed 0)."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    tr, te = _split(x, y, cfg.test_fraction)
    return Dataset("digits", x[tr], y[tr], x[te], y[te], 10, "image")


#: Where standard packages install datasets, searched after ``dataset.data_dir``.
STANDARD_PLACES: dict[str, list[str]] = {
    "fashion-mnist": [
        "/usr/share/datasets/fashion-mnist",
        "~/.cache/hetfed/datasets/fashion-mnist",
        "~/data/fashion-mnist",
    ],
    "mnist": ["/usr/share/datasets/mnist", "~/.cache/hetfed/datasets/mnist", "~/data/mnist"],
    "cifar10": ["~/.cache/hetfed/datasets/cifar-10-batches-py", "~/data/cifar-10-batches-py"],
    "ag_news": ["~/.cache/hetfed/datasets/ag_news", "~/data/ag_news"],
}

HOW_TO_GET = {
    "fashion-mnist": "on Debian/Ubuntu: apt-get install dataset-fashion-mnist; or download the "
    "four *-ubyte.gz files from https://github.com/zalandoresearch/fashion-mnist",
    "mnist": "download train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
    "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz into one folder",
    "cifar10": "download and unpack https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz "
    "(the folder cifar-10-batches-py)",
    "ag_news": "get train.csv and test.csv of AG News (class,title,description) into one folder",
}


def _candidates(name: str, data_dir: str | None) -> list[Path]:
    places = [data_dir] if data_dir else []
    env = os.environ.get("HETFED_DATA")
    if env:
        places.append(str(Path(env) / name))
    places += STANDARD_PLACES.get(name, [])
    return [Path(p).expanduser() for p in places]


def find_folder(name: str, data_dir: str | None, required: list[str]) -> Path:
    """The first candidate folder holding every file in ``required`` (gz or not)."""
    looked = _candidates(name, data_dir)
    for folder in looked:
        if all(_locate(folder, f) is not None for f in required):
            return folder
    where = ", ".join(str(p) for p in looked)
    raise DataError(
        f"dataset {name!r}: files {required} not found; looked in {where}. "
        f"To get them: {HOW_TO_GET[name]}; then set dataset.data_dir to the folder."
    )


def _locate(folder: Path, filename: str) -> Path | None:
    for candidate in (folder / filename, folder / (filename + ".gz")):
        if candidate.is_file():
            return candidate
    return None


def _load_idx_pair(folder: Path, prefix: str) -> tuple[np.ndarray, np.ndarray]:
    images = read_idx(_locate(folder, f"{prefix}-images-idx3-ubyte"))
    labels = read_idx(_locate(folder, f"{prefix}-labels-idx1-ubyte"))
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DataError(
            f"{folder}: {prefix} images {images.shape} and labels {labels.shape} do not match"
        )
    return (images.astype(np.float32) / 255.0), labels.astype(np.int64)


def _load_mnist_like(name: str) -> Callable[[DatasetConfig], Dataset]:
    files = [
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ]

    def load(cfg: DatasetConfig) -> Dataset:
        folder = find_folder(name, cfg.data_dir, files)
        x_tr, y_tr = _load_idx_pair(folder, "train")
        x_te, y_te = _load_idx_pair(folder, "t10k")
        return Dataset(name, x_tr, y_tr, x_te, y_te, 10, "image")

    load.__doc__ = f"{name}: the standard IDX files from a folder."
    return load


def load_cifar10(cfg: DatasetConfig) -> Dataset:
    """CIFAR-10, the "python version" batches folder (data_batch_1..5, test_batch)."""
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    folder = find_folder("cifar10", cfg.data_dir, names)
    parts = [read_cifar_batch(folder / n) for n in names[:5]]
    x_te, y_te = read_cifar_batch(folder / "test_batch")
    x_tr = np.concatenate([p[0] for p in parts])
    y_tr = np.concatenate([p[1] for p in parts])
    scale = np.float32(1 / 255.0)
    return Dataset("cifar10", x_tr.astype(np.float32) * scale, y_tr, x_te.astype(np.float32) * scale, y_te, 10, "image")


def load_ag_news(cfg: DatasetConfig) -> Dataset:
    """AG News from train.csv/test.csv; text — embed it (embed.kind=minilm) to train."""
    folder = find_folder("ag_news", cfg.data_dir, ["train.csv", "test.csv"])
    x_tr, y_tr = read_ag_news_csv(folder / "train.csv")
    x_te, y_te = read_ag_news_csv(folder / "test.csv")
    return Dataset("ag_news", x_tr, y_tr, x_te, y_te, int(max(y_tr.max(), y_te.max())) + 1, "text")


def load_arrays(cfg: DatasetConfig) -> Dataset:
    """User data (.npz/.parquet): x, y, optional client ids and train/test split."""
    if not cfg.path:
        raise DataError("dataset.name = 'arrays' needs dataset.path: a .npz or .parquet file")
    d = read_arrays(cfg.path)
    x = np.asarray(d["x"])
    y = np.asarray(d["y"])
    if len(x) != len(y):
        raise DataError(f"{cfg.path}: x has {len(x)} rows but y has {len(y)}")
    if not np.issubdtype(y.dtype, np.integer):
        raise DataError(f"{cfg.path}: labels y must be integers, got {y.dtype}")
    _, y = np.unique(y, return_inverse=True)
    y = y.astype(np.int64)
    x = x.astype(np.float32) if x.dtype != object else x
    client = np.asarray(d["client"]) if "client" in d else None
    if "split" in d:
        split = np.asarray(d["split"]).astype(str)
        bad = set(np.unique(split)) - {"train", "test"}
        if bad:
            raise DataError(f"{cfg.path}: split must be 'train' or 'test', found {sorted(bad)}")
        tr, te = np.flatnonzero(split == "train"), np.flatnonzero(split == "test")
    else:
        tr, te = _split(x, y, cfg.test_fraction)
    client_train = None
    if client is not None:
        _, codes = np.unique(client, return_inverse=True)
        client_train = codes[tr].astype(np.int64)
    n_classes = int(y.max()) + 1
    modality = "text" if x.dtype == object else "vector"
    return Dataset("arrays", x[tr], y[tr], x[te], y[te], n_classes, modality, client_train)


LOADERS: dict[str, Callable[[DatasetConfig], Dataset]] = {
    "digits": load_digits_dataset,
    "fashion-mnist": _load_mnist_like("fashion-mnist"),
    "mnist": _load_mnist_like("mnist"),
    "cifar10": load_cifar10,
    "ag_news": load_ag_news,
    "arrays": load_arrays,
}


def load_dataset(cfg: DatasetConfig) -> Dataset:
    """Load the dataset the config names; a binary task if ``positive_class`` is set."""
    if cfg.name not in LOADERS:
        raise DataError(f"dataset.name = {cfg.name!r} is not known: expected one of {sorted(LOADERS)}")
    ds = LOADERS[cfg.name](cfg)
    if cfg.positive_class is not None:
        ds = binarise(ds, cfg.positive_class)
    return ds


def binarise(ds: Dataset, positive: int) -> Dataset:
    """One class against all others: an imbalanced binary task (label 1 = ``positive``)."""
    if positive >= ds.n_classes:
        raise DataError(
            f"dataset.positive_class = {positive} is not allowed: expected 0..{ds.n_classes - 1}"
        )
    return replace(
        ds,
        y_train=(ds.y_train == positive).astype(np.int64),
        y_test=(ds.y_test == positive).astype(np.int64),
        n_classes=2,
    )
