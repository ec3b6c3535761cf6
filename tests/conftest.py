"""Shared fixtures. Tests never download: caches go to a temp dir."""

from __future__ import annotations

import os

import numpy as np
import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):  # several workers on two cores: one thread each (and in their subprocesses),
    from hetfed.engine.host_threads import limit_threads  # or they slow down ~10× — numpy's and scipy's BLAS

    limit_threads(1)  # included: numpy, imported above, had one OpenBLAS thread per core whatever the variables said


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Test files with more ``slow`` tests first (pytest-xdist hands out whole files in this order: ``addopts``),
    so that no long file starts last and runs alone while the other workers sit idle — a suite run ended with
    ~2 minutes of one worker on Flower's deployment tests. Within a file, and among files of as many slow tests,
    the collection's order."""
    def file_of(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    slow: dict[str, int] = {}
    for item in items:
        slow[file_of(item)] = slow.get(file_of(item), 0) + bool(item.get_closest_marker("slow"))
    rank = {f: i for i, f in enumerate(slow)}
    items.sort(key=lambda item: (-slow[file_of(item)], rank[file_of(item)]))


def pytest_unconfigure(config: pytest.Config) -> None:
    """If this process (pytest's, or an xdist worker's) is still alive 60 s after its tests ended, every thread's
    stack goes to stderr: suite runs have lingered ~3 minutes at 0 % CPU after printing their summary (two of four
    full runs on 2026-12-01, in CI too), and what they wait on was never seen. Nothing is printed by a process that
    exits in time; the watchdog is faulthandler's own thread, which holds nothing up."""
    import faulthandler
    import sys

    if sys.__stderr__ is not None:
        faulthandler.dump_traceback_later(60, exit=False, file=sys.__stderr__)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("HETFED_CACHE", str(tmp_path_factory.mktemp("cache")))
    monkeypatch.setenv("HETFED_DATA", str(tmp_path_factory.mktemp("nodata")))


@pytest.fixture(autouse=True)
def _drawn_only_where_looked_at(request, monkeypatch):
    """A finished run's or sweep's figures and report.html are drawn only in the tests that look at them (marked
    ``draws``). Drawing costs ~2–4 s of CPU a run — a suite run drew 138 reports, ~5–9 of its ~31 CPU-minutes — and
    the other tests check what a run computes and writes, which the drawing only reads (a drawing that fails is a
    warning, never a failed run: ``hetfed.analysis.present``). Runs in subprocesses still draw."""
    if request.node.get_closest_marker("draws") is None:
        from hetfed.analysis import present

        monkeypatch.setattr(present, "present_run", lambda run_dir, status=None: None)
        monkeypatch.setattr(present, "present_sweep", lambda sweep_dir, console=None: None)


@pytest.fixture
def blobs():
    """A small 3-class dataset with structure in feature space."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(600, 5)).astype(np.float32)
    y = rng.integers(0, 3, size=600)
    x[:, 0] += 3 * y
    return x, y
