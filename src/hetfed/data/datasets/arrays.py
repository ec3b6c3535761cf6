"""``arrays``: a user's own data in one file (.npz or .parquet): x, y, optional client ids and split."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from pydantic import Field

from hetfed.config import DatasetConfig
from hetfed.data.datasets import DatasetKind, register
from hetfed.data.formats import read_arrays
from hetfed.data.loading import (
    Dataset,
    file_record,
    integer_labels,
    numeric_features,
    require_splittable,
    split_fixed,
)
from hetfed.errors import DataError
from hetfed.registry import ComponentParams


class ArraysParams(ComponentParams):
    path: str | None = Field(None, description="the file: .npz or .parquet")


def load_arrays(cfg: DatasetConfig) -> Dataset:
    """User data (.npz/.parquet): x, y, optional client ids and train/test split."""
    path = cfg.params.path
    if not path:
        raise DataError("dataset.name = 'arrays' needs dataset.path: a .npz or .parquet file")
    d = read_arrays(path)
    where = f"dataset.path = {path!r}"
    x = np.asarray(d["x"])
    y = integer_labels(np.asarray(d["y"]), where)
    if x.ndim == 0 or len(x) != len(y):
        raise DataError(f"{where}: x has {x.shape[0] if x.ndim else 0} rows but y has {len(y)}: expected one label per "
                        "row")
    x = numeric_features(x, where)
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
        require_splittable(y, where, cfg.test_fraction)
        tr, te = split_fixed(x, y, cfg.test_fraction)
    client_train = None
    if client is not None:
        _, codes = np.unique(client, return_inverse=True)
        client_train = codes[tr].astype(np.int64)
    n_classes = int(y.max()) + 1 if len(y) else 0
    modality = "text" if x.dtype == object else "vector"
    return Dataset("arrays", x[tr], y[tr], x[te], y[te], n_classes, modality, client_train,
                   sources=(file_record(Path(path)),))


register(DatasetKind("arrays", load_arrays, "your own data: x, y and optional client / split arrays in a .npz or "
                     ".parquet file (dataset.path)", "vector", Params=ArraysParams))
