"""A pytest plugin: each test's busy CPU-seconds of the whole machine (``/proc/stat``) and its wall seconds.

The machine's, not the test process's: Ray's daemons and actors, Flower's SuperLink, SuperNodes and per-message
``flwr-clientapp`` processes are not children a test reaps, so rusage misses them. Meaningful with ``-n 0`` on an
otherwise idle machine (tests in parallel would count each other). One JSON line a test, appended to
``$SYSCPU_OUT`` (default ``syscpu.jsonl`` in the working directory)::

    PYTHONPATH=src:.:results/benchmarks_cpu_2026-12-05b python -m pytest -n 0 -p syscpu -q
"""

from __future__ import annotations

import json
import os
import time

import pytest

_TICK = os.sysconf("SC_CLK_TCK")


def _busy() -> float:
    """The machine's CPU-seconds not idle and not waiting on I/O since boot."""
    with open("/proc/stat") as fh:
        ticks = [int(x) for x in fh.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICK


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    busy, start = _busy(), time.time()
    yield
    with open(os.environ.get("SYSCPU_OUT", "syscpu.jsonl"), "a") as fh:
        fh.write(json.dumps({"id": item.nodeid, "cpu": _busy() - busy, "wall": time.time() - start}) + "\n")
