"""A real SuperLink and SuperNodes on loopback: the in-process numbers, a dead node survived, and the deployment's
processes stopped with it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

pytest.importorskip("flwr", reason="the flower extra is part of the test extra")

from hetfed.processes import descendants, process_alive  # noqa: E402
from tests.flower_compare import REPO, compare, config, summary_of  # noqa: E402


@pytest.mark.slow
def test_a_real_superlink_and_supernodes_give_the_same_numbers_and_survive_a_dead_node(tmp_path, capfd):
    from hetfed.cli import main
    from hetfed.config import dump_config
    from hetfed.flower.deploy import LocalDeployment

    cgau = {"methods": [{"name": "cgau", "algorithm": "fedavg", "model": {"kind": "cgau"}}],
            "partition": {"kind": "feature_clusters", "clients": 3},
            "train": {"rounds": 2, "local_steps": 4, "batch_size": 16}}
    started: list[int] = []
    with LocalDeployment(tmp_path / "dep", 3, superexec_poll=0.5) as dep:
        started = list(dep.pids.values())
        (tmp_path / "cgau.yaml").write_text(dump_config(config(cgau, "flower")))
        capfd.readouterr()
        assert main(["flower", "run", str(tmp_path / "cgau.yaml"), "--deployment", str(dep.directory),
                     "--out", str(tmp_path / "run")]) == 0
        shown = capfd.readouterr().out
        # the console shows hetfed's lines only; Flower's INFO lines are kept in the run directory's log
        assert "cgau" in shown and "INFO" not in shown, shown
        assert "INFO" in (tmp_path / "run" / "flwr-run.log").read_text()
        assert (tmp_path / "run" / "report.html").is_file()  # drawn by the ServerApp, unless --no-report
        deployed = json.loads((tmp_path / "run" / "summary.json").read_text())
        compare(deployed, summary_of(config(cgau, "vectorised"), tmp_path / "vec"))
        # Γ from the summaries the SuperNodes sent equals the in-process Γ of the same federation
        assert deployed["methods"]["cgau"]["gamma_from_summaries"]["gamma"] == pytest.approx(
            deployed["gamma"], rel=1e-6
        )
        # Flower's SuperExecs, which start a process per message, look for messages as often as the deployment says
        execs = [p for pid in dep.pids.values() for p in descendants(pid) if b"superexec" in _proc(p, "cmdline")]
        assert len(execs) >= 3, execs  # one per SuperNode (and the SuperLink's)
        assert all(b"FLWR_SUPEREXEC_TASK_POLL_INTERVAL=0.5" in _proc(p, "environ").split(b"\0") for p in execs)

        # a SuperNode dies after round 1 (whose evaluation carried round 2's training): the run goes on with the
        # others and says who failed (the timeout leaves healthy nodes ample time: each message starts a fresh
        # ClientApp process)
        failing = {**cgau, "train": {**cgau["train"], "rounds": 3},
                   "flower": {"round_timeout": 25, "min_replies": 1}}
        import subprocess

        from hetfed.flower.deploy import _bin, write_app

        app = write_app(tmp_path / "app2")
        from hetfed.config import dump_config

        (app / "run-config.toml").write_text(
            f"config-yaml = {json.dumps(dump_config(config(failing, 'flower')))}\n"
            f"out = {json.dumps(str(tmp_path / 'run2'))}\n")
        proc = subprocess.Popen([_bin("flwr"), "run", str(app), "hetfed-local", "--run-config",
                                 str(app / "run-config.toml"), "--stream"], env=dep.env(),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        metrics = tmp_path / "run2" / "metrics.csv"
        t0 = time.time()
        while time.time() - t0 < 300:
            if metrics.exists() and ",1,summary," in metrics.read_text():
                break
            time.sleep(0.5)
        dep.kill_node(2)
        out, _ = proc.communicate(timeout=400)
        summary = json.loads((tmp_path / "run2" / "summary.json").read_text())
        failed = summary["methods"]["cgau"]["failed_clients"]
        assert failed and all(f["clients"] == [2] for f in failed), failed
        assert summary["methods"]["cgau"]["rounds"] == 3
        assert {f["step"] for f in failed} == {"train", "evaluate"}
        # each node's steps ran in its persistent worker (#50 §3), one per node over both runs; the dead node's
        # worker left with it
        workers = [int(f.read_text()) for f in dep.workers_dir.glob("*.pid")]
        assert len(workers) == 3, workers
        deadline = time.time() + 10
        while sum(map(process_alive, workers)) > 2 and time.time() < deadline:
            time.sleep(0.2)
        assert sum(map(process_alive, workers)) == 2
    for pid in started + workers:  # every process the deployment started is gone, its nodes' workers too
        assert not process_alive(pid), pid


def _proc(pid: int, what: str) -> bytes:
    """/proc/PID/<what> (cmdline, environ), or nothing once the process is gone."""
    try:
        return Path(f"/proc/{pid}/{what}").read_bytes()
    except OSError:
        return b""


@pytest.mark.slow
def test_the_deployment_stops_its_processes_when_the_test_fails(tmp_path):
    from hetfed.flower.deploy import LocalDeployment

    pids: list[int] = []
    with pytest.raises(RuntimeError, match="deliberate"), LocalDeployment(tmp_path / "dep", 2) as dep:
        pids = list(dep.pids.values())
        raise RuntimeError("deliberate")
    assert len(pids) == 3 and not any(process_alive(p) for p in pids)


def test_stopping_a_deployment_stops_the_processes_below_it_in_groups_of_their_own(tmp_path):
    """Flower's SuperExec runs in a process group of its own and starts a run's ServerApp there: stopping the
    deployment by its processes' groups left a ServerApp of a run in progress training on, with no SuperLink."""
    import subprocess

    from hetfed.flower.deploy import LocalDeployment

    # a "SuperLink" (its own group, as the deployment starts it) whose child starts a session of its own
    link = subprocess.Popen(["bash", "-c", "setsid sleep 300 & wait"], start_new_session=True)
    deadline = time.monotonic() + 10
    while not (below := descendants(link.pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert below
    (tmp_path / "dep").mkdir()
    LocalDeployment(tmp_path / "dep", 1, 0, {"superlink": link.pid}).stop(grace=2)
    assert not any(process_alive(p) for p in below) and link.poll() is not None

@pytest.mark.slow
def test_a_deployment_with_a_dead_supernode_fails_in_one_line_that_names_the_clients_no_node_holds(tmp_path, capfd):
    """#72 §4: it printed the ServerApp's traceback, "did not complete (flwr run exit 0)", a Ray hint on a
    deployment without Ray, and a note that flower.connect_timeout — the setting that fired — "is not read"."""
    from hetfed.cli import main
    from hetfed.flower.deploy import LocalDeployment

    with LocalDeployment(tmp_path / "dep", 2, superexec_poll=0.5) as dep:
        dep.kill_node(1)
        capfd.readouterr()
        code = main(["flower", "run", str(REPO / "configs" / "default.yaml"), "--deployment", str(dep.directory),
                     "--out", str(tmp_path / "run"), "--set", "flower.connect_timeout=8", "--set", "train.rounds=1"])
        out, err = capfd.readouterr()
    assert code == 2
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "no node holds clients 5, 6, 7, 8, 9" in errors[0], err
    assert "every SuperNode is running" in errors[0] and "Ray" not in errors[0]
    assert "Traceback" not in out + err and "did not complete" not in err and "is not read" not in err
    assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] == "failed"
