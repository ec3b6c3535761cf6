"""Shared fixtures. Tests never download: caches go to a temp dir."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HETFED_CACHE", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.setenv("HETFED_DATA", str(tmp_path_factory.mktemp("nodata")))


@pytest.fixture
def blobs():
    """A small 3-class dataset with structure in feature space."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 5)).astype(np.float32)
    y = rng.integers(0, 3, size=600)
    x[:, 0] += 3 * y
    return x, y
