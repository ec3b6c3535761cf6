"""The allocator setting of a simulation process (:mod:`hetfed.engine.host_memory`): a round's freed tensors are
reused by the next round instead of being faulted in afresh, and ``HETFED_MALLOC`` is applied or refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hetfed.cli import main

#: a process making and freeing a round's temporaries (6 × 10 MB), then 20 rounds more: whether the settings are in
#: force, the MB the process's resident memory fell by when the first round's were freed, and the minor page faults
#: of a later round
ROUNDS = """
import os, resource, torch
from hetfed.engine.host_memory import keep_freed_memory
applied = keep_freed_memory()
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
def one_round():
    return [torch.ones(2_500_000) for _ in range(6)]
live = one_round()
held = resident()
del live
fell = (held - resident()) / 2**20
one_round()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    one_round()
print(applied, fell, (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def _round(setting: str, **given: str) -> tuple[str, float, float]:
    env = {**{k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES" and not k.startswith("MALLOC_")},
           "HETFED_MALLOC": setting, "OMP_NUM_THREADS": "1", **given}
    out = subprocess.run([sys.executable, "-c", ROUNDS], env=env, capture_output=True, text=True, check=True)
    applied, fell, faults = out.stdout.split()
    return applied, float(fell), float(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc: Linux")
def test_a_rounds_freed_memory_is_kept_and_reused_without_page_faults():
    applied, fell, faults = _round("on")
    assert applied == "True" and fell < 1 and faults < 1500  # 60 MB a round: ~15 000 pages
    applied, fell, _ = _round("off")
    assert applied == "False" and fell > 50  # glibc's own settings: mapped afresh, and handed back when freed
    applied, fell, _ = _round("on", MALLOC_MMAP_THRESHOLD_="1048576")  # a setting of the user's: kept
    assert applied == "False" and fell > 50


def test_a_value_of_hetfed_malloc_that_is_not_allowed_is_refused_before_anything_is_written(tmp_path, monkeypatch,
                                                                                             capsys):
    monkeypatch.setenv("HETFED_MALLOC", "offf")
    default = str(Path(__file__).parents[2] / "configs" / "default.yaml")
    for argv in (["run", "--out", str(tmp_path / "run")],
                 ["sweep", default, "--seeds", "2", "--out", str(tmp_path / "sweep")]):
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "HETFED_MALLOC = 'offf'" in err and "off" in err.split("expected")[1]
    assert not any(tmp_path.iterdir())
