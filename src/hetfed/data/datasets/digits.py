"""``digits``: scikit-learn's bundled 8×8 digits (1 797 images, 10 classes) — the default, offline."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hetfed.config import DatasetConfig
from hetfed.data.datasets import DatasetKind, register
from hetfed.data.loading import Dataset, file_record, split_fixed


def load_digits_dataset(cfg: DatasetConfig) -> Dataset:
    """scikit-learn's bundled 8×8 digits; split 80/20 (stratified, fixed seed 0)."""
    from importlib.resources import files

    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = (bunch.images / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int64)
    tr, te = split_fixed(x, y, cfg.test_fraction)
    source = Path(str(files("sklearn.datasets") / "data" / "digits.csv.gz"))
    sources = (file_record(source),) if source.is_file() else ()
    return Dataset("digits", x[tr], y[tr], x[te], y[te], 10, "image", sources=sources)


register(DatasetKind("digits", load_digits_dataset, "scikit-learn's bundled 8×8 digits, split 80/20", "image"))
