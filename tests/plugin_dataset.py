"""A user's plugin module, as ``plugins: [tests.plugin_dataset]`` names it: one dataset in one file, with a
parameter of its own (``dataset: {name: plugin_blobs, centers: 4}``) — nothing else is edited."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from hetfed.config import DatasetConfig
from hetfed.data.datasets import DatasetKind, register
from hetfed.data.loading import Dataset, split_fixed
from hetfed.registry import ComponentParams


class BlobsParams(ComponentParams):
    centers: int = Field(3, ge=2, description="how many Gaussian blobs (classes)")


def load_blobs(cfg: DatasetConfig) -> Dataset:
    """Gaussian blobs in 5 dimensions, 300 points (scikit-learn's make_blobs, fixed seed)."""
    from sklearn.datasets import make_blobs

    centers = cfg.params.centers
    x, y = make_blobs(n_samples=300, n_features=5, centers=centers, random_state=0)
    tr, te = split_fixed(x, y, cfg.test_fraction)
    return Dataset("plugin_blobs", x[tr].astype(np.float32), y[tr].astype(np.int64), x[te].astype(np.float32),
                   y[te].astype(np.int64), centers, "vector")


register(DatasetKind("plugin_blobs", load_blobs, "Gaussian blobs (a test plugin)", "vector", Params=BlobsParams))
