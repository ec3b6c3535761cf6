"""Resumable checkpoints of a run: everything needed to continue it after a crash or a kill.

One file, ``checkpoints/resume.pt``, rewritten atomically (a temporary file in
the same folder, flushed to disk, then renamed over the old one), so a kill at
any moment leaves either the previous checkpoint or the new one — never half of
one. The one before it is kept as ``resume.prev.pt``: a latest checkpoint that
cannot be read (a disk that lost its last write) falls back to it, with a warning.
It holds:

- the rows of the methods already finished (the learning curves are in metrics.csv);
- for the method in progress, its phase (``federated``: mid-rounds, or
  ``personalised``: FedMoE's per-client models trained, not yet reported), the
  round loop's state (server state, best model and its evaluation, early-stopping
  counters, round number, fault counts, ε) and every client's local state;
- how many bytes of ``metrics.csv`` belong to that state (a resumed run cuts the
  file there, so no row is repeated or lost), and torch's global generator.

Every random stream hetfed draws is keyed by (run seed, round, client), so the
round number is the position of every stream; nothing else needs saving.
"""

from __future__ import annotations

import dataclasses
import io
import os
import shutil
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import torch

from hetfed import streams
from hetfed.engine.types import tensor_bytes
from hetfed.errors import RunError
from hetfed.runs import tensor_pickle
from hetfed.runs.rundir import CHECKPOINTS, MetricsWriter, write_atomic

if TYPE_CHECKING:
    from hetfed.executors.updates import SimulationResult
    from hetfed.server.transport import Transport

RESUME = "resume.pt"
PREVIOUS = "resume.prev.pt"
#: 2: clients' streams drawn by :mod:`hetfed.streams` (hetfed 0.2); 1: per-client host generators (0.1)
VERSION = 2


def checkpoint_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS / RESUME


def write_checkpoint(run_dir: str | Path, payload: dict[str, Any]) -> Path:
    """Save ``payload`` atomically: a kill during the write keeps the previous checkpoint."""
    return _replace_checkpoint(Path(run_dir), lambda fh: tensor_pickle.dump(_versioned(payload), fh))


def _versioned(payload: dict[str, Any]) -> dict[str, Any]:
    return {"version": VERSION, "random_streams": streams.GENERATOR, **payload}


def _replace_checkpoint(run_dir: Path, write: Callable[[IO[bytes]], object]) -> Path:
    """The latest checkpoint kept as the previous one, and ``write`` the new one, atomically and on disk."""
    path = checkpoint_path(run_dir)
    if path.is_file():  # the latest becomes the previous one (a hard link: resume.pt never goes missing)
        link = path.with_name(f".{PREVIOUS}.tmp")
        link.unlink(missing_ok=True)
        try:
            os.link(path, link)
        except OSError:  # a file system without hard links
            shutil.copyfile(path, link)
        os.replace(link, path.with_name(PREVIOUS))
    write_atomic(path, write, binary=True, sync=True)
    return path


#: a checkpoint whose tensors hold at most this many bytes is serialised by the loop and written to disk by a
#: background thread; a larger one is written by the loop itself (in memory it would be held twice)
BACKGROUND_UP_TO = 64 << 20
#: the thread that writes checkpoints to disk, one after the other (more threads, measured with 20 runs of a stacked
#: sweep, contended for the interpreter with the loop: each save took 0.84 ms instead of 0.66)
_WRITERS: ThreadPoolExecutor


def _writers_of_this_process() -> None:
    """This process's writer, made at import and again in a forked child: a child has none of its parent's
    threads, and a pool that had started its writer there would queue the child's checkpoints for a thread that
    does not exist (the run would wait for them forever)."""
    global _WRITERS
    _WRITERS = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hetfed-checkpoint")


_writers_of_this_process()
os.register_at_fork(after_in_child=_writers_of_this_process)


def _write_serialised(run_dir: Path, data: memoryview, metrics_fd: int) -> None:
    """A checkpoint serialised by :meth:`Checkpointer.save`, written on a background thread: metrics.csv (the
    duplicate ``metrics_fd`` of its file, closed here) on disk first, then the checkpoint that records its length."""
    try:
        os.fsync(metrics_fd)
    finally:
        os.close(metrics_fd)
    _replace_checkpoint(run_dir, lambda fh: fh.write(data))


def remove_checkpoints(run_dir: str | Path) -> None:
    """A complete run needs no checkpoint to resume from (its final states are in checkpoints/)."""
    path = checkpoint_path(run_dir)
    path.unlink(missing_ok=True)
    path.with_name(PREVIOUS).unlink(missing_ok=True)


def read_checkpoint(run_dir: str | Path, warn: Callable[[str], object] | None = None) -> dict[str, Any] | None:
    """The run's checkpoint (None when it has none yet); stale temporary files of a killed write are removed.

    A latest checkpoint that cannot be read falls back to the previous one (``warn(message)`` says so);
    when neither can be read, a RunError.
    """
    path = checkpoint_path(run_dir)
    for stale in path.parent.glob(".resume.*tmp") if path.parent.is_dir() else []:
        stale.unlink(missing_ok=True)
    previous = path.with_name(PREVIOUS)
    if not path.is_file():
        return _load(previous) if previous.is_file() else None
    try:
        return _load(path)
    except RunError as err:
        if not previous.is_file():
            raise
        payload = _load(previous)
        if warn is not None:
            warn(f"warning: {err} — continuing from the previous checkpoint {str(previous)!r} instead")
        return payload


def _load(path: Path) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            payload: dict[str, Any] = tensor_pickle.load(fh)
    except Exception as err:
        raise RunError(f"the checkpoint {str(path)!r} cannot be read ({type(err).__name__}: {err}); "
                       "expected a file written by hetfed (rerun the config instead)") from None
    if payload.get("version") == 1:
        raise RunError(f"the checkpoint {str(path)!r} was written by hetfed 0.1, whose clients drew their batches "
                       "and dropout masks from host generators; this version draws them from counter-based streams, "
                       "so resuming would mix two runs' numbers: expected a run made by hetfed ≥ 0.2 (rerun the "
                       "config, or resume with hetfed 0.1)")
    if payload.get("version") != VERSION:
        raise RunError(f"the checkpoint {str(path)!r} has version {payload.get('version')}, this hetfed reads "
                       f"{VERSION}: expected a run made by this version (rerun the config instead)")
    return payload


def check_streams(payload: dict[str, Any], transports: list[Transport]) -> None:
    """Refuse to continue a checkpoint whose clients drew a compressor's numbers from another generator than this
    hetfed's (``random_streams``; a checkpoint without it was written by ``counter-lowbias32-v1``, whose QSGD drew
    its rounding from PCG64 host generators): the resumed rounds would not be the run's."""
    made = payload.get("random_streams", "counter-lowbias32-v1")
    drawing = sorted({t.compressor.name for t in transports if t.compressor is not None and t.compressor.draws})
    if made != streams.GENERATOR and drawing and made in streams.COMPRESSOR_DRAWS_CHANGED:
        raise RunError(f"the checkpoint's clients drew {', '.join(drawing)}'s numbers with random streams {made!r} "
                       f"({streams.COMPRESSOR_DRAWS_CHANGED[made]}); this hetfed draws them with "
                       f"{streams.GENERATOR!r}, "
                       "so resuming would mix two runs' numbers: expected a run started by this version (rerun "
                       "the config, or resume with the hetfed that started it)")


def snapshot(result: SimulationResult) -> dict[str, Any]:
    """A :class:`~hetfed.executors.simulate.SimulationResult` without its executor and with its last evaluation only
    (every evaluation is in metrics.csv); the client store goes beside it."""
    res = dataclasses.replace(result, executor=None, backdoor=None, history=result.history[-1:])
    states: Any = getattr(result.executor, "states", None)
    return {"result": res, "states": states.state_dict() if hasattr(states, "state_dict") else None}


class Checkpointer:
    """Writes a run's checkpoint: the finished methods' rows and the method in progress."""

    def __init__(self, run_dir: Path, writer: MetricsWriter, methods: dict[str, Any], started: str,
                 resumes: int = 0) -> None:
        self.run_dir, self.writer, self.methods = Path(run_dir), writer, methods
        self.started, self.resumes = started, resumes
        self.done: list[str] = []  # labels of the finished methods (their rows are in ``methods``)
        self._writing: Future[None] | None = None  # the last checkpoint, while a background thread writes it

    def save(self, current: dict[str, Any] | None) -> None:
        """Checkpoint now; metrics.csv is flushed first so its length matches the state saved.

        The state is serialised here, as it is now; its files (metrics.csv's fsync, the previous checkpoint's
        link, the new one's write, fsync and rename) are written by a background thread, which the loop does not
        wait for (in a stacked sweep every run checkpoints in the same round: ~1 ms each, mostly the disk's). A
        kill before that write is done leaves the previous checkpoint, as a kill during any write does."""
        self.wait()
        self.writer.flush(durable=False)
        payload = {"methods": self.methods, "done": list(self.done), "current": current,
                   "metrics_offset": self.writer.size(), "torch_rng": torch.get_rng_state(), "started": self.started,
                   "resumes": self.resumes}
        if tensor_bytes(current) > BACKGROUND_UP_TO:
            self.writer.flush()
            write_checkpoint(self.run_dir, payload)
            return
        buffer = io.BytesIO()
        tensor_pickle.dump(_versioned(payload), buffer)
        job = (self.run_dir, buffer.getbuffer(), self.writer.duplicate())
        try:
            self._writing = _WRITERS.submit(_write_serialised, *job)
        except RuntimeError:  # the interpreter is shutting down (a run's thread outliving Ctrl-C): written here
            _write_serialised(*job)

    def wait(self) -> None:
        """The checkpoint being written in the background on disk (its error raised here): before the next one,
        and before the run's end removes them."""
        writing, self._writing = self._writing, None
        if writing is not None:
            writing.result()

    def method_done(self, label: str) -> None:
        self.done.append(label)
        self.save(None)
