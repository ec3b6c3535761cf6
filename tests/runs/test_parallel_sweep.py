"""``hetfed sweep --jobs N``: the same table as one run after another, one progress display, resume."""

from __future__ import annotations

import contextlib
import csv
import json
from pathlib import Path

import pytest

from hetfed.cli import main

REPO = Path(__file__).resolve().parents[2]
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
    assert "[6 runs to train, one at a time]" in serial_out and "[6 runs to train, in 2 processes]" in out
    # resuming with workers reuses every completed run (and has none to train: no line says it will)
    assert main([*BASE, "--out", str(tmp_path / "par"), "--jobs", "2", "--resume"]) == 0
    resumed = capsys.readouterr().out
    assert "6 of 6 runs reused" in resumed and "runs to train" not in resumed


def test_jobs_must_be_positive(capsys):
    assert main([*BASE, "--jobs", "0"]) == 2
    assert "--jobs 0 is not allowed" in capsys.readouterr().err


@pytest.mark.parametrize("stack", [False, True])
def test_a_sweeps_runs_share_their_preparation_where_only_training_differs(tmp_path, monkeypatch, stack):
    """#74 §2: a grid over a training setting computes each seed's partition and Γ once (2 here, not 4) and loads
    the data once for all its seeds (1, not 4), and the numbers are those of runs that prepared their own."""

    from hetfed import pipeline
    from hetfed.runs import sweep

    calls: list[int] = []
    loads: list[int] = []
    original, load = pipeline._prepare, pipeline.load_dataset
    monkeypatch.setattr(pipeline, "_prepare", lambda *a: calls.append(1) or original(*a))
    monkeypatch.setattr(pipeline, "load_dataset", lambda *a: loads.append(1) or load(*a))
    args = ["sweep", str(REPO / "configs" / "default.yaml"), "--set", "partition.clients=4", "--set",
            "train.local_steps=2", "--grid", "train.rounds=2,3", "--seeds", "2", "--quiet",
            *(["--stack"] if stack else [])]
    assert main([*args, "--out", str(tmp_path / "shared")]) == 0
    assert (len(calls), len(loads)) == (2, 1)
    monkeypatch.setattr(sweep, "sharing", contextlib.nullcontext)  # every run prepares its own
    assert main([*args, "--out", str(tmp_path / "own")]) == 0
    assert (len(calls), len(loads)) == (6, 6)  # unshared, the sweep's check of its first run's plan loads once more

    from tests.runs.test_stacked_sweep import _equal, _runs

    _equal(_runs(tmp_path / "shared", ("train.rounds",)), _runs(tmp_path / "own", ("train.rounds",)))


def test_a_sweeps_worker_shares_the_preparations_of_the_runs_it_is_given(tmp_path, monkeypatch):
    """#74 §2 with ``--jobs``: a worker process prepares each seed once for all the runs it is given (it shares as a
    one-process sweep does) — here two grid points of one seed, run one after the other as a worker runs them."""
    from hetfed import pipeline
    from hetfed.config import load_config
    from hetfed.runs import sweep

    monkeypatch.setattr(pipeline, "_SHARED", None)  # put back after the test: the process's sharing ends with it
    calls: list[int] = []
    original = pipeline._prepare
    monkeypatch.setattr(pipeline, "_prepare", lambda *a: calls.append(1) or original(*a))
    monkeypatch.setattr("hetfed.engine.host_threads.limit_threads", lambda n: None)  # this process keeps its own
    sweep._init_worker(1)
    for rounds in (1, 2):
        cfg = load_config(REPO / "configs" / "default.yaml", ["partition.clients=4", "train.local_steps=2",
                                                               f"train.rounds={rounds}"])
        status, _ = sweep._run_one(cfg.model_dump(mode="json"), str(tmp_path / f"r{rounds}"), str(tmp_path))
        assert status == "ok"
    assert len(calls) == 1


def _pools() -> tuple[list[tuple[str, int]], int]:
    import torch
    from threadpoolctl import threadpool_info

    return [(pool["internal_api"], pool["num_threads"]) for pool in threadpool_info()], torch.get_num_threads()


def test_a_sweeps_worker_computes_with_its_share_of_the_cores_in_every_library():
    """``--jobs``: a worker's share of the cores holds for numpy's and scipy's BLAS and OpenMP as for torch (numpy,
    loaded before the worker's initialiser ran, kept one OpenBLAS thread per core: two workers thrashed)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from hetfed.runs import sweep

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=sweep._init_worker,
                             initargs=(1,)) as pool:
        pools, torch_threads = pool.submit(_pools).result(timeout=120)
    assert torch_threads == 1 and {"openblas", "openmp"} <= {api for api, _ in pools}
    assert all(n == 1 for _, n in pools), pools


def test_runs_never_write_into_the_data_a_sweep_shares(tmp_path, monkeypatch):
    """A sweep's runs share their loaded data and preparations (threads of a stacked sweep included), so no run may
    write into them: here every array of a preparation is read-only — the data as loaded and the federation's,
    a server holdout's copy included — and methods of every kind train on it (numpy refuses a write into a
    read-only array, and the run fails)."""
    import dataclasses

    import numpy as np

    from hetfed import pipeline

    prepare = pipeline._prepare

    def read_only(*a):
        prepared = prepare(*a)
        for part in (prepared.data, prepared.federation):  # the data as loaded, the clients' (with a server holdout)
            for f in dataclasses.fields(part):
                value = getattr(part, f.name)
                for array in value if isinstance(value, tuple) else (value,):
                    if isinstance(array, np.ndarray):
                        array.flags.writeable = False
        assert not prepared.federation.x.flags.writeable
        return prepared

    monkeypatch.setattr(pipeline, "_prepare", read_only)
    methods = ("[{name: avg, algorithm: fedavg}, {name: ditto, algorithm: ditto}, {name: fsnet, algorithm: fsnet}, "
               "{name: feddf, algorithm: feddf}, {name: scaffold, algorithm: scaffold}, {name: moe, algorithm: fedmoe},"
               " {name: cgau, algorithm: fedavg, model: {kind: cgau}}]")
    args = ["sweep", str(REPO / "configs" / "default.yaml"), "--set", "partition.clients=4", "--set",
            "train.local_steps=2", "--set", "train.rounds=1", "--set", f"methods={methods}", "--seeds", "2", "--quiet",
            "--stack", "--out", str(tmp_path / "s")]
    assert main(args) == 0
    with open(tmp_path / "s" / "sweep.json") as fh:
        assert json.load(fh)["failed"] == []
