"""#29: defects found trying hetfed as a new user would. Each test failed on the main before the fix."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hetfed.cli import main
from hetfed.config import build_config

FAST = ["--set", "partition.clients=4", "--set", "train.local_steps=2"]


def _one_line_error(capsys) -> str:
    """The one error line (progress lines of the steps before it may precede it)."""
    err = capsys.readouterr().err.strip()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and err.splitlines()[-1] == errors[0], err
    return errors[0]


# ------------------------------------------------------------------ 2. FedDF's holdout on Flower nodes


def test_a_flower_node_builds_the_simulators_federation_and_never_holds_the_servers_data():
    pytest.importorskip("flwr")
    from flwr.app import ConfigRecord

    from hetfed.config import dump_config
    from hetfed.data import embed, load_dataset
    from hetfed.flower.node import node_side
    from hetfed.pipeline import prepare

    cfg = build_config({"partition": {"clients": 4}, "methods": [{"algorithm": "feddf"}]})
    server = prepare(cfg, progress=False).federation
    node = node_side(ConfigRecord({"config": dump_config(cfg), "method": 0})).fed
    assert np.array_equal(node.x, server.x) and all(np.array_equal(a, b) for a, b in zip(node.train, server.train,
                                                                                        strict=True))
    pool = embed(load_dataset(cfg.dataset), cfg.embed, progress=False).x_train
    assert len(node.x) + len(server.server_x) == len(pool)
    rows = np.concatenate([node.x.reshape(len(node.x), -1), server.server_x.reshape(len(server.server_x), -1)])
    # the clients' pool and the server's holdout are a split of the training pool: every row once
    assert np.array_equal(np.unique(rows, axis=0, return_counts=True)[1],
                          np.unique(pool.reshape(len(pool), -1), axis=0, return_counts=True)[1])


# ------------------------------------------------------------------ 4. SIGINT when started in the background


def test_sigint_stops_a_run_started_with_sigint_ignored(tmp_path):
    """`hetfed sweep … &` from a script inherits SIGINT as ignored; `kill -INT` must still stop it."""
    out = tmp_path / "r"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetfed.cli", "run", "--quiet", "--set", "train.rounds=100000", *FAST, "--out",
         str(out)],
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN), env={**os.environ, "OMP_NUM_THREADS": "1"},
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        while not (out / "metrics.csv").is_file() or (out / "metrics.csv").stat().st_size < 200:
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() - t0 < 120, "the run never started training"
            time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 130
    finally:
        proc.kill()
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "failed" and "interrupt" in status["reason"].lower()


def test_an_interrupt_caught_inside_a_string_exec_still_exits_130(tmp_path):
    """A Ctrl-C that lands in a string ``exec`` (a lazy import's dataclass) left CPython's flag set: exit -2."""
    (tmp_path / "interrupted_cli.py").write_text(
        "import hetfed.cli as cli\n"
        "cli.cmd_run = lambda args: exec('raise KeyboardInterrupt')\n"
        "cli.entry()\n")
    proc = subprocess.run([sys.executable, "-m", "interrupted_cli", "run", "--quiet"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}, timeout=120)
    assert "interrupted" in proc.stderr and proc.returncode == 130, proc.stderr


def test_python_dash_m_hetfed_is_the_hetfed_command():
    proc = subprocess.run([sys.executable, "-m", "hetfed", "partition", "--set", "partition.clients=3", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)
    assert subprocess.run([sys.executable, "-m", "hetfed", "run", "--set", "train.rounds=0"], capture_output=True,
                          text=True, timeout=120).returncode == 2  # a refused setting: the CLI's exit status


# ------------------------------------------------------------------ 5. the connect timeout's message


def test_the_connect_timeout_says_it_passed_its_value_and_how_many_nodes_answered():
    from hetfed.flower.executor import missing_nodes_message

    msg = missing_nodes_message([2, 3, 4], asked=5, n_clients=5, timeout=120, waited=120.0, simulated=True)
    assert "flower.connect_timeout = 120 s passed with 2 of 5 clients" in msg and "raise flower.connect_timeout" in msg
    assert "Ray" in msg
    deployed = missing_nodes_message([2, 3, 4], asked=5, n_clients=5, timeout=30, waited=30.0)
    assert "every SuperNode is running" in deployed and "Ray" not in deployed  # #72: no Ray on a deployment
    other = missing_nodes_message([4], asked=4, n_clients=5, timeout=120, waited=3.0)
    assert "none holds clients 4" in other and "partition-id=P num-partitions=K" in other and "passed" not in other


# ------------------------------------------------------------------ 6. the heartbeat lives on a timer


def test_the_heartbeat_is_refreshed_while_the_run_does_nothing_else(tmp_path):
    from hetfed.runs.rundir import Heartbeat, set_status

    beat = Heartbeat(tmp_path, every_s=0.1)
    beat.start()
    first = json.loads((tmp_path / "status.json").read_text())["heartbeat"]
    time.sleep(0.5)  # no progress callback at all
    assert json.loads((tmp_path / "status.json").read_text())["heartbeat"] > first
    beat.stop()
    set_status(tmp_path, "complete")
    time.sleep(0.3)
    assert json.loads((tmp_path / "status.json").read_text())["status"] == "complete"  # the timer is gone


# ------------------------------------------------------------------ 7. refused resume, previous checkpoint


def _interrupted_run(tmp_path: Path, monkeypatch, stop_after: int = 4) -> Path:
    """A run stopped by Ctrl-C after ``stop_after`` training rounds, with checkpoints every round."""
    from hetfed.executors import inprocess as executors

    real, calls = executors.InProcessExecutor.train, {"n": 0}

    def train(self, bc, clients):
        calls["n"] += 1
        if calls["n"] > stop_after:
            raise KeyboardInterrupt
        return real(self, bc, clients)

    monkeypatch.setattr(executors.InProcessExecutor, "train", train)
    out = tmp_path / "r"
    assert main(["run", "--quiet", "--set", "train.rounds=8", "--set", "train.checkpoint_every=1", *FAST,
                 "--set", "methods=[{algorithm: fedavg}]", "--out", str(out)]) == 130
    monkeypatch.setattr(executors.InProcessExecutor, "train", real)
    return out


def test_a_refused_resume_marks_the_run_failed_with_the_reason(tmp_path, monkeypatch, capsys):
    out = _interrupted_run(tmp_path, monkeypatch)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    status = json.loads((out / "status.json").read_text())  # as a SIGKILL leaves it: running, its process gone
    (out / "status.json").write_text(json.dumps({**status, "status": "running", "pid": int(dead.stdout),
                                                 "heartbeat": time.time() - 3600}))
    ckpts = out / "checkpoints"
    (ckpts / "resume.pt").write_bytes((ckpts / "resume.pt").read_bytes()[:100])  # truncated
    (ckpts / "resume.prev.pt").unlink()
    capsys.readouterr()
    assert main(["run", "--resume", str(out)]) == 2
    assert "cannot be read" in _one_line_error(capsys)
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "failed" and status["reason"].startswith("resume refused")


def test_a_corrupt_latest_checkpoint_falls_back_to_the_previous_one(tmp_path, monkeypatch, capsys):
    whole = tmp_path / "whole"
    assert main(["run", "--quiet", "--set", "train.rounds=8", "--set", "train.checkpoint_every=1", *FAST,
                 "--set", "methods=[{algorithm: fedavg}]", "--out", str(whole)]) == 0
    out = _interrupted_run(tmp_path, monkeypatch)
    ckpts = out / "checkpoints"
    assert (ckpts / "resume.prev.pt").is_file()
    (ckpts / "resume.pt").write_bytes(b"not a checkpoint")
    capsys.readouterr()
    assert main(["run", "--quiet", "--resume", str(out)]) == 0
    assert "continuing from the previous checkpoint" in capsys.readouterr().err
    assert (out / "metrics.csv").read_bytes() == (whole / "metrics.csv").read_bytes()
    assert not (ckpts / "resume.pt").exists() and not (ckpts / "resume.prev.pt").exists()


# ------------------------------------------------------------------ 8–11. bad input


def test_a_seed_beyond_the_generators_range_is_one_line_before_loading(tmp_path, capsys, monkeypatch):
    import hetfed.pipeline

    monkeypatch.setattr(hetfed.pipeline, "prepare", lambda *a, **k: pytest.fail("loaded the data"))
    assert main(["run", "--set", "seed=100000000000000000000000", "--out", str(tmp_path / "r")]) == 2
    err = _one_line_error(capsys)
    assert "seed = 100000000000000000000000" in err and "4294967296" in err
    assert not (tmp_path / "r").exists()


def test_a_cgau_without_hidden_layers_is_refused_with_what_to_use_instead(capsys):
    assert main(["config", "--set", "model.hidden=[]"]) == 2
    err = _one_line_error(capsys)
    assert "model.hidden = [] is not allowed with model.kind = 'cgau'" in err and "logreg" in err


def test_gamma_of_a_single_client_is_a_dash_with_the_reason(capsys):
    assert main(["partition", "--set", "partition.clients=1", "--set", "partition.kind=iid"]) == 0
    out = capsys.readouterr().out
    assert "Γ = —" in out and "single client" in out and "Γ = 0.000" not in out


@pytest.mark.parametrize("args,expected", [
    (["--out", "FILE"], "is a file: expected a new or empty directory"),
    (["--set", "train.device=cuda", "--out", "NEW"], "cuda"),
    (["--out", "FILE/run"], "cannot be created for the run: Not a directory"),  # a file where a folder would be made
    (["--out", "/proc/hetfed-run"], "cannot be created"),  # a folder where none can be made (root too)
])
def test_checks_that_need_no_data_come_before_loading_it(tmp_path, capsys, monkeypatch, args, expected):
    import hetfed.runs.runner

    if torch.cuda.is_available() and "train.device=cuda" in args:
        pytest.skip("this machine has CUDA")
    if "/proc/hetfed-run" in args and not Path("/proc/self").is_dir():
        pytest.skip("needs Linux's /proc: a folder where nothing can be made")
    (tmp_path / "FILE").write_text("x")
    args = [str(tmp_path / a) if a in ("FILE", "NEW", "FILE/run") else a for a in args]
    monkeypatch.setattr(hetfed.runs.runner, "prepare", lambda *a, **k: pytest.fail("loaded the data first"))
    assert main(["run", *args]) == 2
    assert expected in _one_line_error(capsys)
    assert not (tmp_path / "NEW").exists()


# ------------------------------------------------------------------ 13. one median convention


def test_the_norm_screen_takes_the_mean_of_the_two_middle_norms():
    from hetfed.engine.types import Upload
    from hetfed.server.screen import Screen

    ref = {"w": torch.zeros(1, dtype=torch.float64)}
    up = Upload([0, 1, 2, 3], {"w": torch.tensor([[1.0], [2.0], [6.0], [11.0]], dtype=torch.float64)}, torch.ones(4))
    screen = Screen(ref, norm_factor=2.0)
    kept = [c for u in [*screen.admit(up), *screen.flush()] for c in u.client_ids]
    assert kept == [0, 1, 2]  # median (2 + 6) / 2 = 4: only 11 > 2 × 4 (the lower middle, 2, dropped 6)


def test_multi_krum_can_weight_the_kept_updates_by_sample_counts_as_flowers_strategy_does():
    from hetfed.engine.types import Upload
    from hetfed.server.combine import parse

    old = {"w": torch.zeros(1, dtype=torch.float64)}
    w = torch.tensor([[1.0], [1.1], [0.9], [1.05], [50.0]], dtype=torch.float64)
    up = Upload(list(range(5)), {"w": w}, torch.tensor([1.0, 3.0, 1.0, 5.0, 1.0]))
    # n = 5, f = ⌊0.1·5⌋ = 0, keep m = 4: the outlier 50 has the worst Krum score and is cut
    kept, n = [1.0, 1.1, 0.9, 1.05], [1.0, 3.0, 1.0, 5.0]
    rule, uniform_params = parse({"rule": "multi_krum", "keep": 4})
    uniform = rule.combine(old, up, uniform_params)["w"].item()
    weighted = rule.combine(old, up, parse({"rule": "multi_krum", "keep": 4, "weighted": True})[1])["w"].item()
    assert uniform == pytest.approx(sum(kept) / 4)
    assert weighted == pytest.approx(sum(a * b for a, b in zip(kept, n, strict=True)) / sum(n))


# ------------------------------------------------------------------ memory: the default norm screen streams


def _norm_upload(ids, norms):
    from hetfed.engine.types import Upload

    v = torch.tensor([[float(x), 0.0] for x in norms])
    return Upload(list(ids), {"w": v}, torch.ones(len(ids)), {"train_loss": torch.zeros(len(ids))})


def test_the_default_norm_screen_holds_only_its_reference_clients_and_streams_the_rest():
    from hetfed.engine.types import RoundUploads, StreamedUpload
    from hetfed.server.screen import Screen

    rng = np.random.default_rng(0)
    norms = rng.uniform(1, 2, 400)
    norms[[5, 250]] = 1000.0  # one far-out update among the reference clients, one after them
    screen = Screen({"w": torch.zeros(2)}, norm_factor=10.0, reference_clients=32)
    rounds = RoundUploads(screen)
    most_held = 0
    for start in range(0, 400, 7):  # chunks of 7 clients
        rounds.add(_norm_upload(range(start, min(start + 7, 400)), norms[start:start + 7]))
        most_held = max(most_held, sum(len(u.client_ids) for u in screen._held) + len(rounds._kept))
    out = rounds.result()
    assert most_held < 32 + 7  # at most the reference clients and one chunk, never the round's 400
    assert isinstance(out, StreamedUpload)
    assert sorted(out.client_ids) == [k for k in range(400) if k not in (5, 250)]
    assert out.screened["rejected_norm"] == 2
    # the reference: the median of the first 32 norms, by hand
    assert screen.median == pytest.approx(float(np.median(norms[:32])))


def test_a_round_within_the_reference_set_is_screened_against_its_own_median_whatever_the_chunks():
    from hetfed.engine.types import RoundUploads
    from hetfed.server.screen import Screen

    norms = [1.0, 2.0, 3.0, 4.0, 30.0, 5.0, 41.0]  # median 4: 41 > 10 × 4 is out, 30 stays
    decisions = []
    for size in (1, 3, 7):
        rounds = RoundUploads(Screen({"w": torch.zeros(2)}, norm_factor=10.0))
        for start in range(0, 7, size):
            rounds.add(_norm_upload(range(start, min(start + size, 7)), norms[start:start + size]))
        decisions.append(sorted(rounds.result().client_ids))
    assert decisions == [[0, 1, 2, 3, 4, 5]] * 3


def test_the_memory_estimate_of_the_default_config_does_not_grow_with_the_clients_per_round():
    from hetfed.algorithms import build_algorithm, resolve_run
    from hetfed.config import ModelConfig, PartitionConfig, TrainConfig
    from hetfed.executors.inprocess import estimate_memory
    from hetfed.models import build_model
    from hetfed.partition import make_federation
    from tests.synthetic import ShiftedGaussians

    train = TrainConfig(rounds=1)
    data = ShiftedGaussians(4000, 4, classes=3, test_per_class=10)
    algo = build_algorithm("fedavg", build_model(ModelConfig(kind="mlp", hidden=[8]), (4,), 3), train)
    feds = [make_federation(data, PartitionConfig(kind="iid", clients=k), 0) for k in (40, 400)]
    held = [estimate_memory(resolve_run(algo, fed, train, 0), fed)["round_updates"] for fed in feds]
    assert held[0] == held[1] > 0  # the 32 reference clients' updates, whatever the round's size


# ------------------------------------------------------------------ 12. Flower's console lines on a deployment


def test_flowers_info_lines_go_to_the_log_and_hetfeds_lines_and_flowers_errors_to_the_console():
    from hetfed.flower.deploy import flower_level, shown

    assert flower_level("\x1b[92mINFO \x1b[0m:      [ROUND 1]\n") == "INFO"
    assert flower_level("WARNING :   DEPRECATED FEATURE\n") == "WARNING"
    assert not shown("\x1b[92mINFO \x1b[0m:      Starting Flower ServerApp\n")
    assert not shown("\x1b[93mWARNING \x1b[0m:   DEPRECATED FEATURE\n")
    assert shown("\x1b[91mERROR \x1b[0m:     ServerApp thread raised an exception\n")
    assert shown("round 2/3 · acc 0.812 (global)\n")
    assert not shown("Successfully installed hetfed-flower-app to /x/apps\n")
    assert shown("INFORMATION about clients: 3\n")  # hetfed's own lines are never taken for Flower's


# ------------------------------------------------------------------ 4. Ray's start on a loaded machine


def test_the_simulation_engine_is_started_again_only_when_it_failed_before_any_node_answered(tmp_path):
    from hetfed.flower.simulation import start_with_retries

    log = tmp_path / "flower.log"
    calls, started = [], {"yes": False}

    def flaky():  # Ray's start fails twice, then the nodes answer
        calls.append(1)
        if len(calls) < 3:
            raise RuntimeError("GCS has become overloaded")
        started["yes"] = True

    start_with_retries(flaky, lambda: started["yes"], log)
    assert len(calls) == 3 and log.read_text().count("starting it again") == 2

    def always():  # a real failure is not hidden: it comes back after the last attempt
        raise RuntimeError("GCS has become overloaded")

    with pytest.raises(RuntimeError, match="overloaded"):
        start_with_retries(always, lambda: False, None, attempts=2)

    def fails_in_the_run():  # once a node has answered, a failure is the run's own: never repeated
        calls.append(1)
        started["yes"] = True
        raise ValueError("server step")

    calls.clear()
    with pytest.raises(ValueError, match="server step"):
        start_with_retries(fails_in_the_run, lambda: started["yes"], None)
    assert len(calls) == 1


# ------------------------------------------------------------------ Flower's replies polled without 3-second sleeps


def test_replies_are_collected_as_soon_as_they_come_and_the_timeout_is_kept():
    from types import SimpleNamespace

    from hetfed.flower.exchange import send_and_receive

    class Grid:  # replies become available 0.05 s and 0.1 s after the push
        def __init__(self):
            self.t0 = None

        def push_messages(self, messages):
            self.t0 = time.monotonic()
            return ["a", "b"]

        def pull_messages(self, ids):
            ready = {"a": 0.05, "b": 0.1}
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in ids
                    if time.monotonic() - self.t0 >= ready[i]]

    t0 = time.monotonic()
    got = send_and_receive(Grid(), [], timeout=10)
    assert sorted(m.metadata.reply_to_message_id for m in got) == ["a", "b"]
    assert time.monotonic() - t0 < 1.0  # Flower's GrpcGrid would have slept 3 s after its first empty poll

    class Silent(Grid):
        def pull_messages(self, ids):
            return []

    t0 = time.monotonic()
    assert send_and_receive(Silent(), [], timeout=0.3) == []
    assert 0.25 < time.monotonic() - t0 < 1.0


# ------------------------------------------------------------------ YAML 1.1's on/off/yes/no


def test_a_yaml_key_named_on_is_the_setting_not_a_boolean():
    """`heterogeneity: {on: all}` read as YAML 1.1 made the key True ("Keys should be strings")."""
    from hetfed.config_io import parse_yaml_text

    cfg = build_config(parse_yaml_text("heterogeneity: {on: all}\ntrain: {optimizer: {reset_each_round: no}}", "test"))
    assert cfg.heterogeneity.on == "all" and cfg.train.optimizer.reset_each_round is False


# ------------------------------------------------------------------ #72 §4: bad input found after the run directory


def test_a_clock_file_without_a_row_per_client_is_refused_before_any_run_directory(tmp_path, capsys):
    clock = tmp_path / "clock.csv"
    clock.write_text("client,sample_seconds\n0,1\n1,2\n")
    out = tmp_path / "run"
    assert main(["run", *FAST, "--set", "train.clock.latency=file", "--set", f"train.clock.file={clock}",
                 "--set", "train.rounds=1", "--out", str(out), "--quiet"]) == 2
    line = _one_line_error(capsys)
    assert "train.clock.file" in line and "one row for each client 0 … 3" in line and "(2 rows read)" in line
    assert not out.exists()


def test_flower_missing_is_refused_before_any_run_directory(tmp_path, capsys, monkeypatch):
    """Without Flower installed, `train.executor: flower` is refused in one line and writes nothing."""
    import builtins

    real = builtins.__import__

    def no_flower(name, *args, **kwargs):
        if name == "flwr" or name.startswith("flwr."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_flower)
    from hetfed import flower

    if hasattr(flower.require_flwr, "cache_clear"):
        flower.require_flwr.cache_clear()
    out = tmp_path / "run"
    assert main(["run", *FAST, "--set", "train.executor=flower", "--set", "train.rounds=1", "--out", str(out),
                 "--quiet"]) == 2
    assert "needs Flower" in _one_line_error(capsys)
    assert not out.exists()


@pytest.mark.parametrize("typed,expected", [
    ("partition=dirichlet", "partition = 'dirichlet': expected a section of keys (kind, clients, "),
    ("server.combine=krum", "to choose its rule: --set server.combine.rule=krum (in YAML, server: {combine: "
                            "{rule: krum}})"),
    ("train.optimizer=adam", "to choose its kind: --set train.optimizer.kind=adam"),
    ("train=5", "train = 5: expected a section of keys (rounds, "),
    ("methods=[fedavg]", "methods.0 = 'fedavg': expected a section of keys (name, algorithm, params, "),
])
def test_one_value_for_a_whole_section_says_which_key_to_set(tmp_path, capsys, typed, expected):
    """``--set partition=dirichlet`` was answered with pydantic's 'a valid dictionary or instance of
    PartitionConfig': a class name, not what to type."""
    assert main(["run", "--set", typed, "--out", str(tmp_path / "run")]) == 2
    line = _one_line_error(capsys)
    assert expected in line and "instance of" not in line, line
    assert not (tmp_path / "run").exists()
