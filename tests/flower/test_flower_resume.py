"""A Flower run survives a killed ServerApp: ``hetfed flower run --resume`` continues from the checkpoint (#26 §5)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the flower extra is part of the test extra")

from hetfed.config import build_config, dump_config  # noqa: E402
from hetfed.runs.runner import run_experiment  # noqa: E402

BASE = {
    "partition": {"kind": "feature_clusters", "clients": 2},
    "train": {"rounds": 3, "local_steps": 4, "batch_size": 16, "eval_every": 1, "checkpoint_every": 1},
    "flower": {"connect_timeout": 300},
}


def _config(methods: list[dict], executor: str):
    raw = json.loads(json.dumps({**BASE, "methods": methods}))
    raw["train"]["executor"] = executor
    return build_config(raw)


def _ancestors(pid: int) -> list[int]:
    out = []
    while pid > 1:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                pid = int(fh.read().split(")")[-1].split()[1])
        except OSError:
            break
        out.append(pid)
    return out


def _serverapps(link_pid: int) -> list[int]:
    """The ServerApp processes this deployment's SuperLink started (``flwr-serverapp``)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if b"flwr-serverapp" in cmd and link_pid in _ancestors(int(entry)):
                found.append(int(entry))
    return found


def _submit(dep, cfg, out: Path, app: Path) -> subprocess.Popen:
    from hetfed.flower.deploy import CONNECTION, _bin, write_app

    write_app(app)
    (app / "run-config.toml").write_text(
        f"config-yaml = {json.dumps(dump_config(cfg))}\nout = {json.dumps(str(out))}\n"
    )
    return subprocess.Popen([_bin("flwr"), "run", str(app), CONNECTION, "--run-config", str(app / "run-config.toml"),
                             "--stream"], env=dep.env(), stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def _kill_after(dep, proc: subprocess.Popen, metrics: Path, method: str, rnd: int) -> None:
    """SIGKILL the ServerApp once ``method`` has reported round ``rnd`` (its checkpoint is written by then)."""
    deadline = time.time() + 300
    while time.time() < deadline:
        if metrics.exists() and f"{method},{rnd},summary," in metrics.read_text():
            break
        time.sleep(0.2)
    else:
        raise AssertionError(f"{method} never reached round {rnd}")
    pids = _serverapps(dep.pids["superlink"])
    assert pids, "no ServerApp process found"
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    proc.kill()
    proc.wait()
    from hetfed.runs.rundir import process_alive

    deadline = time.time() + 30
    while any(process_alive(p) for p in pids) and time.time() < deadline:  # SIGKILL is delivered, not yet done
        time.sleep(0.1)


@pytest.mark.slow
def test_a_killed_serverapp_resumes_to_the_uninterrupted_numbers(tmp_path, capfd):
    from hetfed.cli import main
    from hetfed.flower.deploy import LocalDeployment
    from hetfed.runs.checkpoint import read_checkpoint

    methods = [{"name": "fedavg", "algorithm": "fedavg"},
               {"name": "cgau", "algorithm": "fedavg", "model": {"kind": "cgau"}, "train": {"rounds": 1}}]
    reference = run_experiment(_config(methods, "vectorised"), out=tmp_path / "vec", progress=False).summary
    with LocalDeployment(tmp_path / "dep", 2) as dep:
        out = tmp_path / "run"
        # killed after FedAvg's round 2: its clients keep nothing between rounds, so the resume is exact
        _kill_after(dep, _submit(dep, _config(methods, "flower"), out, tmp_path / "app"), out / "metrics.csv", "fedavg",
                    2)
        current = read_checkpoint(out)["current"]
        assert current["label"] == "fedavg" and current["client_keys"] == [] and current["result"].rounds_done >= 1
        capfd.readouterr()
        assert main(["flower", "run", "--resume", str(out), "--deployment", str(dep.directory), "--no-report"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["resumed"] == 1
    for name, m in reference["methods"].items():  # CGAU ran after the resume, from its start
        for when in ("final", "best"):
            for key, value in m[when].items():
                got = summary["methods"][name][when][key]
                assert got == pytest.approx(value, rel=1e-5, abs=1e-6), (name, when, key)
    rows = [tuple(line.split(",")[:5]) for line in (out / "metrics.csv").read_text().splitlines()[1:]]
    fedavg = [r for r in rows if r[0] == "fedavg" and r[2] == "summary"]
    assert len(fedavg) == len(set(fedavg))  # no row repeated …
    assert {int(r[1]) for r in fedavg} == set(range(1, 4))  # … or lost


def _killed_flower_run(tmp_path: Path, methods: list[dict], rounds_done: int, keys_of: str) -> Path:
    """A run directory as a Flower ServerApp killed mid-rounds leaves it: config, failed status, checkpoint."""
    from hetfed.algorithms import algorithm_for
    from hetfed.engine.types import ServerState
    from hetfed.executors.simulate import SimulationResult
    from hetfed.runs.checkpoint import write_checkpoint
    from hetfed.runs.rundir import set_status
    from hetfed.runs.runner import client_state_keys

    cfg = _config(methods, "flower")
    run = tmp_path / "killed"
    run.mkdir()
    (run / "config.yaml").write_text(dump_config(cfg))
    (run / "metrics.csv").write_text("method,round,split,client,metric,value\n")
    set_status(run, "failed", reason="killed")
    method = next(m for m in cfg.methods if m.label == keys_of)
    keys = client_state_keys(algorithm_for(cfg, method, (64,), 10))
    result = SimulationResult(ServerState({}, rounds_done), rounds_done=rounds_done)
    write_checkpoint(run, {"methods": {}, "done": [], "metrics_offset": 0, "started": "", "resumes": 0,
                           "current": {"index": 0, "label": keys_of, "phase": "federated", "client_keys": keys,
                                       "result": result, "states": None}})
    return run


def test_resuming_a_method_whose_clients_keep_state_is_refused_before_anything_is_sent(tmp_path, capsys):
    from hetfed.cli import main

    cgau = [{"name": "cgau", "algorithm": "fedavg", "model": {"kind": "cgau"}}]
    run = _killed_flower_run(tmp_path, cgau, 2, "cgau")
    assert main(["flower", "run", "--resume", str(run), "--deployment", str(tmp_path / "no-deployment")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "cannot resume method 'cgau' on Flower after round 2" in err and "cgau.0.filter.cond" in err, err
    assert "train.executor vectorised" in err


def test_resume_takes_no_config_and_a_new_run_needs_out(tmp_path, capsys):
    from hetfed.cli import main

    assert main(["flower", "run", "configs/default.yaml", "--resume", str(tmp_path), "--deployment",
                 str(tmp_path)]) == 2
    assert "is not allowed with CONFIG" in capsys.readouterr().err
    assert main(["flower", "run", "configs/default.yaml", "--deployment", str(tmp_path)]) == 2
    assert "needs --out DIR" in capsys.readouterr().err
