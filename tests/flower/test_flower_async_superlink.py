"""An asynchronous server on a real SuperLink, and SIGTERM to `hetfed flower run` stopping the run there."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the flower extra is part of the test extra")

from hetfed.processes import process_alive  # noqa: E402
from tests.flower_compare import REPO, config  # noqa: E402

pytestmark = pytest.mark.slow


def test_an_asynchronous_server_on_a_real_superlink_merges_replies_as_they_come(tmp_path, capfd):
    """FedBuff with ``train.clock.latency: wall`` on a loopback deployment (a SuperLink, three SuperNodes): the
    server pushes each client its message when it sends it and merges the replies in the order they come; every
    update merges its buffer, the staleness is real and ``sim_time`` is the run's seconds."""
    import pandas as pd

    from hetfed.cli import main
    from hetfed.config import dump_config
    from hetfed.flower.deploy import LocalDeployment

    cfg = {"partition": {"clients": 6}, "methods": [{"name": "fedbuff", "algorithm": "fedbuff",
                                                     "params": {"concurrency": 4, "buffer": 2}}],
           "train": {"rounds": 4, "clock": {"latency": "wall"}}}
    with LocalDeployment(tmp_path / "dep", 3, superexec_poll=0.5) as dep:
        (tmp_path / "a.yaml").write_text(dump_config(config(cfg, "flower")))
        capfd.readouterr()
        assert main(["flower", "run", str(tmp_path / "a.yaml"), "--deployment", str(dep.directory),
                     "--out", str(tmp_path / "run"), "--no-report"]) == 0
        _sigterm_stops_the_submitted_run(tmp_path, dep)
    # --no-report reaches the ServerApp (which draws where it runs: the other deployment test's run has its report)
    assert not list((tmp_path / "run").glob("*.html")) and not (tmp_path / "run" / "figures").exists()
    assert f"`hetfed report {tmp_path / 'run'}` draws them" in capfd.readouterr().out
    m = pd.read_csv(tmp_path / "run" / "metrics.csv")
    train = m[m.split == "train"].pivot_table(index="round", columns="metric", values="value")
    assert list(train.index) == [1, 2, 3, 4] and (train.clients_aggregated == 2).all()
    assert train.sim_time.is_monotonic_increasing and train.staleness_max.max() >= 1


def _sigterm_stops_the_submitted_run(tmp_path: Path, dep) -> None:
    """SIGTERM to `hetfed flower run` stops the run on the SuperLink (Flower's `flwr run --stream` would only stop
    streaming, its ServerApp training on): exit 143, the ServerApp gone, its directory marked failed saying why."""
    import subprocess
    import sys

    from hetfed.flower.deploy import CONNECTION, _bin

    out = tmp_path / "stopped"
    proc = subprocess.Popen([sys.executable, "-m", "hetfed.cli", "flower", "run",
                             str(REPO / "configs" / "default.yaml"), "--deployment", str(dep.directory),
                             "--out", str(out), "--no-report", "--set", "train.rounds=100000",
                             "--set", "methods=[{algorithm: fedavg}]", "--set", "partition.clients=3"],
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "stopped.err").open("w"))
    try:
        t0 = time.monotonic()
        while not (out / "metrics.csv").is_file() or (out / "metrics.csv").stat().st_size < 300:
            assert proc.poll() is None and time.monotonic() - t0 < 300, (tmp_path / "stopped.err").read_text()
            time.sleep(0.5)
        server_app = json.loads((out / "status.json").read_text())["pid"]
        proc.send_signal(15)
        assert proc.wait(timeout=120) == 143, (tmp_path / "stopped.err").read_text()
    finally:
        proc.kill()
    assert "stopping Flower run" in (tmp_path / "stopped.err").read_text()
    deadline = time.monotonic() + 30  # the ServerApp writes its status on its way out
    while process_alive(server_app) and time.monotonic() < deadline:
        time.sleep(0.5)
    status = json.loads((out / "status.json").read_text())
    assert not process_alive(server_app) and status["status"] == "failed" and "flwr stop" in status["reason"], status
    runs = json.loads(subprocess.run([_bin("flwr"), "ls", CONNECTION, "--format", "json"], env=dep.env(),
                                     capture_output=True, text=True).stdout)["runs"]
    assert not [r for r in runs if r["status"].startswith("running")], runs
