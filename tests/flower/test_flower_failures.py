"""A failure anywhere in a Flower run, or a signal during it, ends it with one line and its exit status, and leaves
no Ray process."""

from __future__ import annotations

import json
import os
import time

import pytest

pytest.importorskip("flwr", reason="the flower extra is part of the test extra")

from hetfed.processes import descendants, process_alive  # noqa: E402
from tests.one_actor import ONE_ACTOR_SET  # noqa: E402

pytestmark = pytest.mark.slow


# ------------------------------------------------------------------ #29: failures end the run with one line

_PATCH = {
    "server step": "import hetfed.flower.executor as e\nreal = e.FlowerExecutor.train\n"
                   "def train(self, bc, clients):\n    if bc.round >= 1:\n        raise RuntimeError('injected server "
                   "failure')\n"
                   "    return real(self, bc, clients)\ne.FlowerExecutor.train = train\n",
    "record conversion": "import hetfed.flower.executor as e\n"
                         "def boom(bc):\n    raise TypeError('injected: extras cannot travel')\ne.broadcast_to_records "
                         "= boom\n",
    "client step": "",  # patched in Ray's workers (where the ClientApps run) by sitecustomize
}
# Ray's worker processes only (the ClientApps run there): every Python process Ray starts runs the hook, and Ray's
# own daemons (its dashboard agent, log monitor, …) each importing torch made this case cost ~60 s instead of ~20
_CLIENT_HOOK = ("import sys\nif sys.argv and sys.argv[0].endswith('default_worker.py'):\n"
                "    import hetfed.flower.client_app as c\n    def boom(*a, **k):\n"
                "        raise RuntimeError('injected ClientApp failure')\n    c.train_step = boom\n")


@pytest.mark.parametrize("where,expected", [
    ("server step", "Flower's ServerApp failed: RuntimeError: injected server failure"),
    ("record conversion", "Flower's ServerApp failed: TypeError: injected: extras cannot travel"),
    ("client step", "every ClientApp failed in step 'train', round 0 (client 0: RuntimeError: injected ClientApp "
                    "failure)"),
])
def test_a_failure_anywhere_in_a_flower_run_ends_it_with_one_line(tmp_path, where, expected):
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if where == "client step":
        (tmp_path / "hook").mkdir()
        (tmp_path / "hook" / "sitecustomize.py").write_text(_CLIENT_HOOK)
        env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "hook"), env.get("PYTHONPATH", "")])
    out = tmp_path / "r"
    script = _PATCH[where] + "import sys\nfrom hetfed.cli import main\nsys.exit(main(sys.argv[1:]))\n"
    proc = subprocess.run(
        [sys.executable, "-c", script, "run", "--quiet", "--set", "train.executor=flower", "--set",
         "partition.clients=3",
         "--set", "train.rounds=3", "--set", "methods=[{algorithm: fedavg}]", "--set", "flower.connect_timeout=300",
         "--set", ONE_ACTOR_SET, "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=400)  # a guard against hanging
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 2, proc.stderr
    assert len(errors) == 1 and expected in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "failed" and status["reason"]
    assert "starting it again" not in (out / "flower.log").read_text()  # the run's own failure: never repeated


# In hetfed's process (`python -m`; not Ray's), each reply Ray hands over takes half a second to deserialise: a
# signal then finds Flower's worker thread inside ray.get — where Flower's own stop shut Ray down under it, and Ray
# ended the process with exit status 1 ("The core worker has already been shutdown"; seen in CI now and then)
_SLOW_REPLIES_HOOK = ("import sys\nif sys.argv[:1] == ['-m']:\n    import time\n    import ray._private.worker as w\n"
                      "    real = w.Worker.deserialize_objects\n"
                      "    def slow(*a, **k):\n        time.sleep(0.5)\n        return real(*a, **k)\n"
                      "    w.Worker.deserialize_objects = slow\n")


@pytest.mark.parametrize("signum,times,code,reason", [(15, 1, 143, "terminated by SIGTERM"),
                                                     (2, 2, 130, "interrupted (Ctrl-C)")])
def test_a_signal_during_a_flower_run_stops_it_with_its_exit_status_and_leaves_no_ray_process(tmp_path, signum, times,
                                                                                             code, reason):
    """Once: the run stops at the ServerApp's next exchange, Flower's engine as after a finished run. Twice (the second
    while the first waits for the ClientApps): at once, by the process's own exit — unwinding would run Flower's stop,
    the race below (the same exit status and reason; Ctrl-C's once differs from SIGTERM's only in both)."""
    import subprocess
    import sys

    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(_SLOW_REPLIES_HOOK)
    out = tmp_path / "r"
    proc = subprocess.Popen(
        [sys.executable, "-m", "hetfed.cli", "run", "--quiet", "--set", "train.executor=flower", "--set",
         "partition.clients=3", "--set", "train.rounds=100000", "--set", "methods=[{algorithm: fedavg}]",
         "--set", "flower.connect_timeout=300", "--set", ONE_ACTOR_SET, "--out", str(out)],
        env={**os.environ, "OMP_NUM_THREADS": "1",
             "PYTHONPATH": os.pathsep.join([str(tmp_path / "hook"), os.environ.get("PYTHONPATH", "")])},
        stdout=subprocess.DEVNULL,
        stderr=(tmp_path / "stderr").open("w"), text=True)  # a file: Ray's output would fill a pipe and block
    try:
        t0 = time.monotonic()
        while not (out / "metrics.csv").is_file() or (out / "metrics.csv").stat().st_size < 300:
            assert proc.poll() is None, (tmp_path / "stderr").read_text()
            assert time.monotonic() - t0 < 300, "the Flower run never started training"
            time.sleep(0.5)
        ray = descendants(proc.pid)
        assert ray, "Ray's processes run below hetfed"
        proc.send_signal(signum)
        if times == 2:
            time.sleep(0.5)  # two signals at once would be handled once
            proc.send_signal(signum)
        assert proc.wait(timeout=120) == code, (tmp_path / "stderr").read_text()
    finally:
        proc.kill()
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "failed" and status["reason"] == reason
    assert ("stopped at once" in (tmp_path / "stderr").read_text()) == (times == 2)
    # Ray's workers exit on their own once hetfed has stopped them; on a loaded 2-core machine that can take
    # a few seconds, so poll (up to 15 s) rather than sleep a fixed time — a process still alive then was left behind
    deadline = time.monotonic() + 15
    while (alive := {p for p in ray if process_alive(p)}) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive, f"Ray processes left behind: {sorted(alive)}"
