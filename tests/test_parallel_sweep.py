"""``hetfed sweep --jobs N``: the same table as one run after another, one progress display, resume."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from hetfed.cli import main

REPO = Path(__file__).resolve().parents[1]
BASE = ["sweep", str(REPO / "configs" / "default.yaml"), "--set", "train.rounds=3",
        "--grid", "partition.shuffle=0,0.5,1", "--seeds", "2"]


def _table(path: Path) -> dict[tuple, float]:
    with open(path / "sweep.csv") as fh:
        rows = list(csv.DictReader(fh))
    return {(r["partition.shuffle"], r["method"], r["metric"]): float(r["mean"]) for r in rows
            if "seconds" not in r["metric"]}


@pytest.mark.slow
def test_parallel_sweep_gives_the_serial_table_and_resumes(tmp_path, capsys):
    assert main([*BASE, "--out", str(tmp_path / "serial"), "--jobs", "1"]) == 0
    serial_out = capsys.readouterr().out
    assert main([*BASE, "--out", str(tmp_path / "par"), "--jobs", "2"]) == 0
    out = capsys.readouterr().out
    serial, parallel = _table(tmp_path / "serial"), _table(tmp_path / "par")
    assert serial.keys() == parallel.keys()
    for key, value in serial.items():  # workers use 1 thread each: equal up to float reduction order
        assert parallel[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    for text in (serial_out, out):
        assert "[6/6 done, 0 failed, 0 left, ETA" in text
    # resuming with workers reuses every completed run
    assert main([*BASE, "--out", str(tmp_path / "par"), "--jobs", "2", "--resume"]) == 0
    assert "6 of 6 runs reused" in capsys.readouterr().out


def test_jobs_must_be_positive(capsys):
    assert main([*BASE, "--jobs", "0"]) == 2
    assert "--jobs 0 is not allowed" in capsys.readouterr().err
