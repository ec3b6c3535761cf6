"""#50 §3: a deployment's ClientApp (one process per message) hands the message to the node's persistent worker.

What a user relies on: the worker's step is the ClientApp's own step (same reply, same records written into the
node's context, bit for bit, over rounds that read back what the last one wrote); an error in the step reaches
Flower as the ClientApp's failure, and the worker serves the next message; the worker leaves with the process that
starts the node's ClientApps, or when idle; it refuses a directory other users can reach; the ClientApp process
imports no torch. The loopback deployments in ``test_flower_superlink.py`` and ``test_flower_async_superlink.py``
run through workers and check that none is left.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

flwr = pytest.importorskip("flwr")

from flwr.app import Context, Message, RecordDict  # noqa: E402

from hetfed.flower import worker  # noqa: E402

CONFIG = {"dataset": {"name": "digits"}, "partition": {"kind": "feature_clusters", "clients": 4},
          "methods": [{"name": "cgau", "algorithm": "fedavg", "model": {"kind": "cgau"}}],
          "train": {"rounds": 2, "local_steps": 3, "batch_size": 16, "executor": "flower"},
          "flower": {"clients_per_node": 2}}
NODE = {"partition-id": 1, "num-partitions": 2}


@pytest.fixture
def workers(tmp_path, monkeypatch):
    """A private worker directory for the test — deep, as a deployment's in a project can be (a Unix socket's path
    is limited to ~104 bytes: the sockets live elsewhere) —, its workers stopped after it."""
    directory = tmp_path / ("deep-" * 25) / "workers"
    monkeypatch.setenv("HETFED_WORKER_DIR", str(directory))
    monkeypatch.setenv("HETFED_CACHE", str(tmp_path / "cache"))
    from flwr.supercore.task_identity import TaskIdentity

    for name, value in (("_run_id", 1), ("_node_id", 0), ("_task_id", 1)):  # the server's, who sends the messages
        monkeypatch.setattr(TaskIdentity, name, value)
    yield directory
    if directory.is_dir():
        worker.stop_workers(directory)


def _context() -> Context:
    return Context(run_id=1, node_id=7, node_config=dict(NODE), state=RecordDict(), run_config={})


def _records(content: RecordDict) -> dict:
    """A reply's records as plain values (arrays as NumPy), to compare bit for bit."""
    out = {}
    for name, record in content.items():
        if hasattr(record, "to_numpy_ndarrays"):
            out[name] = {k: v.numpy() for k, v in record.items()}
        else:
            out[name] = dict(record)
    return out


def _equal(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].keys() == b[name].keys(), name
        for k in a[name]:
            x, y = a[name][k], b[name][k]
            if isinstance(x, np.ndarray):
                assert x.dtype == y.dtype and np.array_equal(x, y), (name, k)
            else:
                assert x == y, (name, k)


def _messages():
    """The set-up query and a round's training message for node 1's clients, as the server builds them."""
    from hetfed.config import build_config
    from hetfed.engine.rng import SERVER_INIT, torch_gen
    from hetfed.flower.executor import FlowerExecutor, query_content
    from hetfed.flower.node import node_side
    from hetfed.flower.records import RUN

    config = build_config(CONFIG)
    server = FlowerExecutor(None, config, 0)
    query = Message(query_content(config, server.config_text, 0, False), dst_node_id=7, message_type="query")
    side = node_side(query.content.config_records[RUN], NODE)
    held = [2, 3]
    server.nodes, server.offsets = {k: 7 for k in held}, {7: 0}
    state = side.run.algo.server_init(torch_gen(config.seed, SERVER_INIT))
    trains = []
    for r in range(2):
        _, contents = server._contents(side.run.algo.broadcast(state, r), held)
        trains.append(Message(contents[7], dst_node_id=7, message_type="train"))
    return query, trains


def test_a_workers_steps_are_the_clientapps_own_bit_for_bit_states_included(workers):
    from hetfed.flower import client_app, lean_app

    query, trains = _messages()
    here, there = _context(), _context()
    _equal(_records(lean_app.query(query, there).content), _records(client_app.query(query, here).content))
    for message in trains:  # round 2 loads the client states round 1 wrote: they came back from the worker
        _equal(_records(lean_app.train(message, there).content), _records(client_app.train(message, here).content))
        assert list(there.state.keys()) == list(here.state.keys()) and len(here.state) == 2
        _equal(_records(there.state), _records(here.state))
    assert len(list(workers.glob("*.pid"))) == 1  # one worker served all three messages


def test_an_error_in_the_step_fails_the_message_and_the_worker_serves_the_next(workers):
    from hetfed.flower import lean_app
    from hetfed.flower.records import RUN

    query, trains = _messages()
    broken = RecordDict({k: v for k, v in trains[0].content.items() if k != RUN})
    with pytest.raises(worker.WorkerError, match=r"failed on a 'train' message(.|\n)*KeyError"):
        lean_app.train(Message(broken, dst_node_id=7, message_type="train"), _context())
    with pytest.raises(worker.WorkerError, match=r"handler = '_step' is not allowed; expected one of query"):
        worker.forward("_step", query, _context())  # only the steps can be called, nothing else of the module
    assert "node" in lean_app.query(query, _context()).content  # the same worker answers
    assert len(list(workers.glob("*.pid"))) == 1


def test_with_the_worker_off_the_clientapp_runs_the_step_itself(workers, monkeypatch):
    from hetfed.flower import lean_app

    monkeypatch.setenv("HETFED_FLOWER_WORKER", "0")
    query, _ = _messages()
    assert "node" in lean_app.query(query, _context()).content
    assert not workers.exists() or not list(workers.glob("*.pid"))


def _serving(path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read() if proc.stdout else proc.returncode
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            if s.connect_ex(str(path)) == 0:
                return
        time.sleep(0.05)
    raise AssertionError("the worker never listened")


def test_a_worker_leaves_with_the_process_that_starts_the_clientapps_when_idle_or_stopped(workers):
    workers.mkdir(mode=0o700, parents=True)
    path = worker.socket_dir() / f"test-{os.getpid()}.sock"

    def start(parent: int, **env: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-m", "hetfed.flower.worker", str(path), str(parent)],
                                env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        _serving(path, proc)
        return proc

    parent = subprocess.Popen(["sleep", "120"])
    proc = start(parent.pid)
    try:
        parent.kill()
        parent.wait()
        assert proc.wait(timeout=10) == 0
        assert not path.exists()  # it took its socket with it
        idle = start(os.getpid(), HETFED_WORKER_IDLE="0.5")
        assert idle.wait(timeout=10) == 0  # its parent lives on; a second without a message was enough
        stopped = start(os.getpid())
        stopped.terminate()  # what stop_workers sends
        assert stopped.wait(timeout=10) == 0 and not path.exists()
    finally:
        parent.kill()
        for p in (proc, locals().get("idle"), locals().get("stopped")):
            if p is not None:
                p.kill()


def test_a_worker_directory_others_can_reach_is_refused(tmp_path, monkeypatch):
    open_dir = tmp_path / "shared"
    open_dir.mkdir()
    open_dir.chmod(0o755)
    monkeypatch.setenv("HETFED_WORKER_DIR", str(open_dir))
    with pytest.raises(worker.WorkerError, match=r"HETFED_WORKER_DIR=.*closed to others.*mode 0o755.*expected"):
        worker.worker_dir()


def test_the_deployments_clientapp_process_imports_no_torch():
    script = ("import sys, hetfed.flower.lean_app\n"
              "print(sorted(m for m in ('torch', 'scipy', 'sklearn', 'pandas', 'hetfed.flower.client_app') "
              "if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_a_nodes_process_computes_with_its_client_threads_in_every_library(tmp_path):
    """A node's process (a simulation runs one per worker on the machine's cores) computes with
    ``HETFED_CLIENT_THREADS`` threads in torch and in numpy's and scipy's BLAS and OpenMP alike — numpy's OpenBLAS
    used to keep one thread per core."""
    code = (
        "from flwr.app import ConfigRecord\n"
        "from threadpoolctl import threadpool_info\n"
        "import torch\n"
        "from hetfed.config import build_config, dump_config\n"
        "from hetfed.flower.node import node_side\n"
        "cfg = build_config({'partition': {'clients': 4}, 'methods': [{'algorithm': 'fedavg'}]})\n"
        "node_side(ConfigRecord({'config': dump_config(cfg), 'method': 0}))\n"
        "print(sorted({p['num_threads'] for p in threadpool_info()}), torch.get_num_threads())\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", code], env={**env, "HETFED_CLIENT_THREADS": "1"},
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[-2] == "[1] 1"
