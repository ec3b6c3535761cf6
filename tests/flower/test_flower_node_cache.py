"""A SuperNode builds a simulated federation once per run and reads it back afterwards: the same federation,
and a rebuild when a data file it was built from changed."""

from __future__ import annotations

import os

import numpy as np
import pytest

pytest.importorskip("flwr", reason="the flower extra is part of the test extra")

from hetfed.config import build_config  # noqa: E402


def _same(a, b) -> None:
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y) and a.input_shape == b.input_shape
    for split in ("train", "val", "test"):
        assert all(np.array_equal(p, q) for p, q in zip(getattr(a, split), getattr(b, split), strict=True))
    assert np.array_equal(a.opted_out, b.opted_out) and np.array_equal(a.y_global_test, b.y_global_test)
    for held in ("server_x", "server_y"):
        assert (getattr(a, held) is None) == (getattr(b, held) is None)
        if getattr(a, held) is not None:
            assert np.array_equal(getattr(a, held), getattr(b, held))


def test_the_cached_federation_is_the_built_one_and_a_changed_file_rebuilds_it(tmp_path):
    from hetfed.flower import node_cache
    from hetfed.pipeline import build_federation

    rng = np.random.default_rng(0)
    path = tmp_path / "d.npz"
    np.savez(path, x=rng.normal(size=(200, 5)).astype(np.float32), y=rng.integers(0, 3, 200))
    cfg = build_config({"dataset": {"name": "arrays", "path": str(path)},
                        "partition": {"kind": "dirichlet", "clients": 5, "opt_out": 0.2},
                        "methods": [{"algorithm": "feddf"},  # a server holdout too, labelled for FLTrust's root set
                                    {"algorithm": "fedavg", "server": {"combine": {"rule": "fltrust"}}}]})
    assert node_cache.load(cfg) is None
    built = build_federation(cfg, progress=False)
    node_cache.save(cfg, built.federation, None, built.sources)
    fed, measure = node_cache.load(cfg)
    _same(fed, built.federation)
    assert measure is None and fed.server_x is not None and fed.server_y is not None
    other = build_config({**cfg.model_dump(mode="json"), "seed": 1})
    assert node_cache.load(other) is None  # another seed is another federation
    np.savez(path, x=rng.normal(size=(200, 5)).astype(np.float32), y=rng.integers(0, 3, 200))
    os.utime(path, ns=(1, 1))
    assert node_cache.load(cfg) is None  # the file changed: stale
