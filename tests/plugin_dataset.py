"""A user's plugin module, as ``plugins: [tests.plugin_dataset]`` names it: one dataset in one file."""

from __future__ import annotations

import numpy as np

from hetfed.config import DatasetConfig
from hetfed.data.datasets import DatasetKind, register
from hetfed.data.loading import Dataset, split_fixed


def load_blobs(cfg: DatasetConfig) -> Dataset:
    """Three Gaussian blobs in 5 dimensions, 300 points (scikit-learn's make_blobs, fixed seed)."""
    from sklearn.datasets import make_blobs

    x, y = make_blobs(n_samples=300, n_features=5, centers=3, random_state=0)
    tr, te = split_fixed(x, y, cfg.test_fraction)
    return Dataset("plugin_blobs", x[tr].astype(np.float32), y[tr].astype(np.int64), x[te].astype(np.float32),
                   y[te].astype(np.int64), 3, "vector")


register(DatasetKind("plugin_blobs", load_blobs, "three Gaussian blobs (a test plugin)", "vector"))
