"""Checkpoints serialised by the loop and written to disk by a background thread (:meth:`Checkpointer.save`): what
is saved is the state when the loop asked, the run's end waits for the write, a failed write is raised, and a
checkpoint too large to hold in memory twice is written by the loop itself."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from hetfed.cli import main
from hetfed.runs import checkpoint
from hetfed.runs.checkpoint import Checkpointer, checkpoint_path, read_checkpoint
from hetfed.runs.rundir import MetricsWriter


def _checkpointer(tmp_path):
    writer = MetricsWriter(tmp_path / "metrics.csv")
    return Checkpointer(tmp_path, writer, {}, "now"), writer


def test_a_checkpoint_holds_the_state_when_saved_though_the_loop_changes_it_before_the_write(tmp_path, monkeypatch):
    gate = threading.Event()
    write = checkpoint._write_serialised

    def held(*args):
        gate.wait(10)  # the write waits until the loop has moved on
        write(*args)

    monkeypatch.setattr(checkpoint, "_write_serialised", held)
    ckpt, writer = _checkpointer(tmp_path)
    params = {"w": torch.zeros(3)}
    writer.write("m", 1, "global", "all", {"acc": 0.5})
    ckpt.save({"index": 0, "states": params})
    params["w"] += 7.0  # the next round, in place
    writer.write("m", 2, "global", "all", {"acc": 0.6})
    writer.flush(durable=False)
    assert not checkpoint_path(tmp_path).exists()  # still being written
    gate.set()
    ckpt.wait()
    payload = read_checkpoint(tmp_path)
    assert torch.equal(payload["current"]["states"]["w"], torch.zeros(3))
    # the length of metrics.csv it recorded is the rows written before it, not after
    assert (tmp_path / "metrics.csv").read_bytes()[:payload["metrics_offset"]].decode().splitlines()[-1].endswith("0.5")
    writer.close()


def test_a_write_that_fails_in_the_background_is_raised_at_the_next_checkpoint(tmp_path, monkeypatch):
    def fails(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "_write_serialised", fails)
    ckpt, writer = _checkpointer(tmp_path)
    ckpt.save(None)
    with pytest.raises(OSError, match="No space left"):
        ckpt.save(None)
    writer.close()


def test_a_checkpoint_larger_than_the_background_limit_is_written_by_the_loop(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint, "BACKGROUND_UP_TO", 10)
    monkeypatch.setattr(checkpoint, "_write_serialised", lambda *a: pytest.fail("written in the background"))
    ckpt, writer = _checkpointer(tmp_path)
    ckpt.save({"states": {"w": torch.ones(4)}})  # 16 bytes of tensors
    assert torch.equal(read_checkpoint(tmp_path)["current"]["states"]["w"], torch.ones(4))
    writer.close()


def test_a_run_ends_without_a_checkpoint_left_when_its_last_write_is_slow(tmp_path, monkeypatch):
    """The run's end waits for the checkpoint being written before it removes the checkpoints (a write finishing
    after the removal would leave a complete run with a resume.pt)."""
    import time

    write = checkpoint._write_serialised

    def slow(*args):
        time.sleep(0.2)
        write(*args)

    monkeypatch.setattr(checkpoint, "_write_serialised", slow)
    out = tmp_path / "run"
    assert main(["run", "--quiet", "--set", "train.rounds=2", "--set", "train.checkpoint_every=1",
                 "--set", "methods=[{algorithm: fedavg}]", "--out", str(out)]) == 0
    time.sleep(0.5)  # a write still under way would have landed by now
    assert not checkpoint_path(out).exists() and not list((out / "checkpoints").glob(".*tmp"))


def _checkpoint_in_child(path: str, queue) -> None:
    Path(path).mkdir()
    ckpt, writer = _checkpointer(Path(path))
    ckpt.save(None)
    ckpt.wait()
    writer.close()
    queue.put(checkpoint_path(path).is_file())


def test_a_process_forked_after_a_checkpoint_writes_its_own(tmp_path):
    """The writer thread started in this process is not in a forked child: the child's checkpoints get a thread of
    their own (else its run would wait for them forever)."""
    import multiprocessing

    ckpt, writer = _checkpointer(tmp_path)
    ckpt.save(None)
    ckpt.wait()  # this process's writer thread is running now
    writer.close()
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_checkpoint_in_child, args=(str(tmp_path / "child"), queue))
    child.start()
    child.join(30)
    alive = child.is_alive()
    if alive:
        child.kill()
    assert not alive and queue.get(timeout=5)


def test_a_checkpoints_result_does_not_grow_with_its_rounds_and_an_older_one_still_loads() -> None:
    """What a checkpoint pickles of a run's result is as large after 40 rounds as after 10 (the loop kept every
    round's training loss in it once, which nothing read: 2 ms a checkpoint at 2 000 rounds), and a result pickled
    with that old field loads without it."""
    import io
    import pickle

    from hetfed.algorithms import build_algorithm
    from hetfed.config import ModelConfig, PartitionConfig, TrainConfig
    from hetfed.engine.types import ServerState
    from hetfed.executors.simulate import simulate
    from hetfed.executors.updates import SimulationResult
    from hetfed.models import build_model
    from hetfed.partition import make_federation
    from tests.synthetic import ShiftedGaussians

    fed = make_federation(ShiftedGaussians(200, 4, classes=3, test_per_class=5),
                          PartitionConfig(kind="dirichlet", alpha=0.5, clients=3), 0)
    sizes = []
    for rounds in (10, 40):
        train = TrainConfig(rounds=rounds, local_steps=1, batch_size=8, eval_every=1000)
        model = build_model(ModelConfig(kind="logreg"), fed.input_shape, fed.n_classes)
        result = simulate(build_algorithm("fedavg", model, train), fed, train, 0)
        sizes.append(len(pickle.dumps(checkpoint.snapshot(result)["result"])))
    assert sizes[0] == sizes[1]
    old = SimulationResult(ServerState({}, 3))
    old.__dict__["train_losses"] = [(1, 0.5), (2, 0.4)]  # as a checkpoint of an earlier version holds it
    buffer = io.BytesIO()
    torch.save(old, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer, weights_only=False)
    assert not hasattr(loaded, "train_losses") and loaded.server.round == 3
