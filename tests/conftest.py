"""Shared fixtures. Tests never download: caches go to a temp dir."""

from __future__ import annotations

import os

import numpy as np
import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # two workers on two cores: one thread each (and in their subprocesses),
    from hetfed.engine.host_threads import limit_threads  # or both slow down ~10× — numpy's and scipy's BLAS

    limit_threads(1)  # included: numpy, imported above, had one OpenBLAS thread per core whatever the variables said


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
