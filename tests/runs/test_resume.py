"""Runs that survive being killed (#13): SIGKILL a run at several points — mid-rounds, during a
checkpoint write, during FedMoE's personalisation — resume it each time, and compare with a run
that was never interrupted: metrics.csv byte for byte, and every method's best and final metrics."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hetfed.cli import main

#: every method the issue names, small enough to run in seconds on digits
ARGS = [
    "--set", "train.rounds=8", "--set", "train.checkpoint_every=2", "--set", "train.eval_every=2",
        "--set", "methods=[{name: avg, algorithm: fedavg, model: {kind: mlp}, server: {optimizer: {kind: yogi, lr: "
                 "0.05}}}, {name: cgau, algorithm: fedavg, "
    "model: {kind: cgau}}, {name: fsnet, algorithm: fsnet, model: {kind: mlp}, params: {server_steps: 5}}, "
    "{name: fedmoe, algorithm: fedmoe, model: {kind: mlp}, params: {max_epochs: 4, patience: 2}}]",
]

#: the process under test: hetfed's CLI, slowed down and reporting where it is, so the test can kill it there
WRAPPER = r"""
import os, sys, time
progress = open(os.environ["PROGRESS"], "a", buffering=1)
from hetfed.executors import inprocess as executors
from hetfed.runs import rundir
train, personalise = executors.InProcessExecutor.train, executors.InProcessExecutor.personalise
def slow_train(self, bc, clients):
    out = train(self, bc, clients)
    progress.write(f"train {bc.round}\n"); time.sleep(0.03)
    return out
def slow_personalise(self, *a, **k):
    progress.write("personalise\n"); time.sleep(1.0)
    return personalise(self, *a, **k)
class SlowOs:
    def __getattr__(self, name):
        return getattr(os, name)
    def replace(self, src, dst):
        if str(dst).endswith("resume.pt"):  # between the checkpoint's temporary file and its rename
            progress.write("checkpoint-write\n"); time.sleep(0.3)
        os.replace(src, dst)
executors.InProcessExecutor.train, executors.InProcessExecutor.personalise = slow_train, slow_personalise
rundir.os = SlowOs()
from hetfed.cli import main
sys.exit(main([*sys.argv[1:], "--no-report"]))  # no test of a killed run looks at its figures
"""


def _start(args: list[str], progress: Path) -> subprocess.Popen:
    env = {**os.environ, "PROGRESS": str(progress), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-c", WRAPPER, *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def _kill_when(proc: subprocess.Popen, progress: Path, done, timeout: float = 120) -> bool:
    """SIGKILL ``proc`` once ``done(lines)`` holds; False if it finished first."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        lines = progress.read_text().splitlines() if progress.exists() else []
        if done(lines):
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.01)
    proc.kill()
    raise AssertionError("the run never reached the kill point")


@pytest.mark.slow
def test_a_run_killed_four_times_and_resumed_equals_the_uninterrupted_run(tmp_path):
    ref, run = tmp_path / "ref", tmp_path / "run"
    proc = _start(["run", "--quiet", *ARGS, "--out", str(ref)], tmp_path / "ref.progress")
    assert proc.wait() == 0, proc.stderr.read()

    rng = random.Random(13)
    kills = [  # (where, condition on this process's progress lines)
        ("mid-rounds (fedavg)", lambda n: lambda lines: sum(ln.startswith("train") for ln in lines) >= n,
         rng.randint(3, 7)),
        ("during a checkpoint write", lambda n: lambda lines: lines.count("checkpoint-write") >= n, rng.randint(2, 4)),
        ("mid-rounds (later method)", lambda n: lambda lines: sum(ln.startswith("train") for ln in lines) >= n,
         rng.randint(6, 12)),
        ("during FedMoE's personalisation", lambda n: lambda lines: "personalise" in lines, 0),
    ]
    survived = []
    args = ["run", "--quiet", *ARGS, "--out", str(run)]
    for i, (where, condition, n) in enumerate(kills):
        progress = tmp_path / f"kill{i}.progress"
        if _kill_when(_start(args, progress), progress, condition(n)):
            survived.append(where)
            status = json.loads((run / "status.json").read_text())
            assert status["status"] == "running"  # SIGKILL: no chance to say so; resume must cope
        args = ["run", "--quiet", "--resume", str(run)]
    assert len(survived) == 4, survived
    last = _start(args, tmp_path / "final.progress")
    assert last.wait() == 0, last.stderr.read()

    assert (run / "metrics.csv").read_bytes() == (ref / "metrics.csv").read_bytes()
    a, b = (json.loads((d / "summary.json").read_text()) for d in (ref, run))
    assert set(a["methods"]) == set(b["methods"]) == {"avg", "cgau", "fsnet", "local", "fedavg", "finetuned", "mixture"}
    for name, m in a["methods"].items():
        assert b["methods"][name]["best"] == m["best"], name
        assert b["methods"][name]["final"] == m["final"], name
        assert b["methods"][name].get("best_round") == m.get("best_round"), name
    assert b["resumed"] == 4 and "resumed" not in a
    assert not list((run / "checkpoints").glob(".resume.pt.*"))  # the write killed midway left nothing behind
    for label in ("cgau", "fedmoe"):  # every client's local parameters, as in the uninterrupted run
        import torch

        x, y = (torch.load(d / "checkpoints" / f"{label}-clients.pt") for d in (ref, run))
        assert x["client_ids"] == y["client_ids"]
        assert all(torch.equal(x["states"][k], y["states"][k]) for k in x["states"])


def test_resume_refuses_a_complete_run_and_other_arguments(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", "--quiet", "--set", "train.rounds=2", "--out", str(out)]) == 0
    capsys.readouterr()
    assert main(["run", "--resume", str(out)]) == 2
    assert "already complete" in capsys.readouterr().err
    assert main(["run", "--resume", str(out), "--set", "seed=1"]) == 2
    assert "--set" in capsys.readouterr().err
    assert main(["run", "--resume", str(tmp_path / "nothing")]) == 2
    assert "config.yaml" in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_killed_before_its_first_checkpoint_restarts_cleanly(tmp_path):
    out = tmp_path / "r"
    progress = tmp_path / "p"
    args = ["run", "--quiet", "--set", "train.rounds=6", "--set", "train.checkpoint_every=5", "--out", str(out)]
    assert _kill_when(_start(args, progress), progress, lambda lines: len(lines) >= 2)
    assert not (out / "checkpoints" / "resume.pt").exists()
    proc = _start(["run", "--quiet", "--resume", str(out)], tmp_path / "p2")
    assert proc.wait() == 0, proc.stderr.read()
    ref = tmp_path / "ref"
    proc = _start(args[:-1] + [str(ref)], tmp_path / "p3")
    assert proc.wait() == 0
    assert (out / "metrics.csv").read_bytes() == (ref / "metrics.csv").read_bytes()


@pytest.mark.slow
@pytest.mark.parametrize("method", [
    "{name: agn, algorithm: agnostic_fl, params: {lambda_lr: 0.5}}",
    "{name: cfl, algorithm: cfl, params: {eps1: 1.0e6, eps2: 1.0e-9, warmup_rounds: 3}}"])
def test_a_method_whose_server_keeps_more_than_a_model_resumes_to_the_uninterrupted_numbers(tmp_path, method):
    """Agnostic FL's λ and mean of its iterates, CFL's clusters (split at round 4 here) and update norms are server
    extras: killed mid-run and resumed, metrics.csv — their findings every round among it — is the uninterrupted
    run's byte for byte."""
    args = ["run", "--quiet", "--set", "train.rounds=8", "--set", "train.checkpoint_every=2",
            "--set", "train.eval_every=2", "--set", "heterogeneity.iid_draws=0", "--set", f"methods=[{method}]"]
    ref, out = tmp_path / "ref", tmp_path / "r"
    proc = _start([*args, "--out", str(ref)], tmp_path / "p0")
    assert proc.wait() == 0, proc.stderr.read()
    progress = tmp_path / "p1"
    assert _kill_when(_start([*args, "--out", str(out)], progress), progress,
                      lambda lines: sum(ln.startswith("train") for ln in lines) >= 6)
    proc = _start(["run", "--quiet", "--resume", str(out)], tmp_path / "p2")
    assert proc.wait() == 0, proc.stderr.read()
    assert (out / "metrics.csv").read_bytes() == (ref / "metrics.csv").read_bytes()
    a, b = (json.loads((d / "summary.json").read_text()) for d in (ref, out))
    assert b["resumed"] == 1
    (name, m), = a["methods"].items()
    for key in ("best", "final", "best_round", "findings"):
        assert b["methods"][name][key] == m[key], key
    assert m["findings"]


def test_a_killed_runs_checkpoint_loads_in_one_call_and_predicts_per_client(tmp_path):
    import numpy as np

    import hetfed

    out, progress = tmp_path / "r", tmp_path / "p"
    args = ["run", "--quiet", "--set", "train.rounds=30", "--set", "train.checkpoint_every=2",
            "--set", "methods=[{name: cgau, algorithm: fedavg, model: {kind: cgau}}]", "--out", str(out)]
    assert _kill_when(_start(args, progress), progress, lambda lines: len(lines) >= 9)
    model = hetfed.open_run(out).model("cgau", which="checkpoint")
    assert model.clients == list(range(10))
    fed = hetfed.build_federation(hetfed.load_config(out / "config.yaml"))
    x, y = fed.client_data(3, "test")
    own = (model.predict(x, client=3) == y).mean()
    from hetfed.runs.checkpoint import read_checkpoint

    result = read_checkpoint(out)["current"]["result"]
    if result.best_round == result.rounds_done:  # best = latest: what client 3 reported for that round
        metrics = hetfed.open_run(out).metrics()
        row = metrics.query(f"method == 'cgau' and split == 'client' and client == '3' and "
                            f"metric == 'local_accuracy' and round == {result.best_round}")
        assert own == pytest.approx(float(row["value"].iloc[0]), abs=1e-12)
    assert own > 0.1
    assert model.predict(x).shape == y.shape and np.isin(model.predict(x), np.arange(10)).all()


def test_a_killed_runs_checkpoint_predicts_with_the_rows_its_server_kept_for_each_client(tmp_path):
    """pFedHN's clients predict with the models its hypernetwork generated for them at the best round so far: the
    checkpoint's server, bound to the run's federation as it was (unbound, it generated rows for no client)."""
    import hetfed
    from hetfed.runs.checkpoint import read_checkpoint

    out, progress = tmp_path / "r", tmp_path / "p"
    args = ["run", "--quiet", "--set", "train.rounds=40", "--set", "train.checkpoint_every=2", "--set",
            "heterogeneity.gamma=false", "--set", "methods=[{name: pfedhn, algorithm: pfedhn}]", "--out", str(out)]
    assert _kill_when(_start(args, progress), progress, lambda lines: len(lines) >= 9)
    model = hetfed.open_run(out).model("pfedhn", which="checkpoint")
    fed = hetfed.build_federation(hetfed.load_config(out / "config.yaml"))
    best = read_checkpoint(out)["current"]["result"].best_round
    scored = hetfed.open_run(out).metrics().query(f"method == 'pfedhn' and split == 'client' and round == {best} and "
                                                  "metric == 'local_accuracy'").set_index("client")["value"]
    for k in (0, 3):
        x, y = fed.client_data(k, "test")
        assert (model.predict(x, client=k) == y).mean() == pytest.approx(float(scored[str(k)]), abs=1e-12)


@pytest.mark.slow
def test_sweep_resume_continues_a_killed_run_from_its_checkpoint(tmp_path):
    """`hetfed sweep --resume`: the run killed mid-way continues in place (not moved aside, not restarted)."""
    repo = Path(__file__).resolve().parents[2]
    args = ["sweep", str(repo / "configs" / "default.yaml"), "--quiet", "--grid", "partition.shuffle=0,0.5",
            "--seeds", "1", "--set", "train.rounds=6", "--set", "train.checkpoint_every=2"]
    ref = subprocess.run([sys.executable, "-m", "hetfed.cli", *args, "--out", str(tmp_path / "ref")], cwd=repo,
                         capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert ref.returncode == 0, ref.stderr
    progress = tmp_path / "p"
    out = tmp_path / "sweep"
    proc = subprocess.Popen([sys.executable, "-c", WRAPPER, *args, "--out", str(out)], cwd=repo,
                            env={**os.environ, "PROGRESS": str(progress), "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert _kill_when(proc, progress, lambda lines: lines.count("checkpoint-write") >= 2)
    killed = next(out.glob("*/seed=0/checkpoints/resume.pt")).parents[1]
    resumed = _start([*args, "--out", str(out), "--resume"], tmp_path / "p2")
    assert resumed.wait() == 0, resumed.stderr.read()
    assert json.loads((killed / "summary.json").read_text())["resumed"] == 1  # continued, in place
    assert not list(out.glob("*/*.incomplete-*"))
    def accuracies(path: Path) -> list[str]:  # every row but the timings
        return [ln for ln in path.read_text().splitlines() if "seconds" not in ln]

    assert accuracies(out / "sweep.csv") == accuracies(tmp_path / "ref" / "sweep.csv")


def test_a_sweep_resumed_after_an_upgrade_reuses_runs_that_lack_a_new_setting(tmp_path, capsys):
    """A setting added to hetfed since a run was made is absent from its config.yaml: read with its default, the
    behaviour the run had, it is the same config — resuming reuses the run instead of refusing or redoing it."""
    import yaml

    from hetfed.cli import main

    args = ["sweep", "configs/default.yaml", "--set", "train.rounds=2", "--seeds", "1", "--out", str(tmp_path / "s")]
    assert main(args) == 0
    config = next((tmp_path / "s").glob("*/seed=*/config.yaml"))
    text = config.read_text()
    assert "  pca_components: 2\n" in text
    config.write_text(text.replace("  pca_components: 2\n", ""))  # as written before the setting existed
    capsys.readouterr()
    assert main([*args, "--resume"]) == 0
    assert "1 of 1 runs reused" in capsys.readouterr().out
    config.write_text(text.replace("pca_components: 2", "pca_components: 3"))  # a real change is refused
    assert main([*args, "--resume"]) != 0
    assert "partition.pca_components: 3 → 2" in capsys.readouterr().err
    # as written before components owned their parameters: every partitioner's keys in one flat section, the server
    # optimiser's beside the others — read back with their migration, the same config: reused
    raw = yaml.safe_load(text)
    raw["partition"].update({"alpha": 0.5, "p": 0.8, "min_size": 10, "shard_cut": "within_class"})
    opt = raw["server"].pop("optimizer")
    raw["server"].update({"optimizer": opt["kind"], "lr": opt["lr"], "momentum": 0.9, "beta1": 0.9, "tau": 0.001})
    config.write_text(yaml.safe_dump(raw, sort_keys=False))
    capsys.readouterr()
    assert main([*args, "--resume"]) == 0
    assert "1 of 1 runs reused" in capsys.readouterr().out


@pytest.mark.slow
def test_methods_whose_server_keeps_a_row_per_client_resume_to_the_uninterrupted_numbers(tmp_path):
    """FedCAC's customised models, FedFomo's models and affinities, pFedHN's hypernetwork and momentum, FedPAC's
    heads and pFedLA's hypernetworks live in the server state: a run SIGKILLed mid-rounds and resumed writes the
    uninterrupted metrics.csv."""
    methods = ("methods=[{name: cac, algorithm: fedcac}, {name: fomo, algorithm: fedfomo}, "
               "{name: hn, algorithm: pfedhn}, {name: pac, algorithm: fedpac}, {name: la, algorithm: pfedla}]")
    args = ["--set", "train.rounds=6", "--set", "train.checkpoint_every=2", "--set", "train.eval_every=2",
            "--set", "partition.clients=6", "--set", methods]
    ref, run = tmp_path / "ref", tmp_path / "run"
    proc = _start(["run", "--quiet", *args, "--out", str(ref)], tmp_path / "ref.progress")
    assert proc.wait() == 0, proc.stderr.read()
    progress = tmp_path / "kill.progress"
    killed = _kill_when(_start(["run", "--quiet", *args, "--out", str(run)], progress),
                        progress, lambda lines: sum(ln.startswith("train") for ln in lines) >= 15)
    assert killed
    last = _start(["run", "--quiet", "--resume", str(run)], tmp_path / "final.progress")
    assert last.wait() == 0, last.stderr.read()
    assert (run / "metrics.csv").read_bytes() == (ref / "metrics.csv").read_bytes()
