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
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hetfed import streams
from hetfed.errors import RunError
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
    path = checkpoint_path(run_dir)
    if path.is_file():  # the latest becomes the previous one (a hard link: resume.pt never goes missing)
        link = path.with_name(f".{PREVIOUS}.tmp")
        link.unlink(missing_ok=True)
        try:
            os.link(path, link)
        except OSError:  # a file system without hard links
            shutil.copyfile(path, link)
        os.replace(link, path.with_name(PREVIOUS))
    write_atomic(path, lambda fh: torch.save({"version": VERSION, "random_streams": streams.GENERATOR, **payload}, fh),
                 binary=True, sync=True)
    return path


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
        payload: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
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
    res = dataclasses.replace(result, executor=None, history=result.history[-1:])
    states: Any = getattr(result.executor, "states", None)
    return {"result": res, "states": states.state_dict() if hasattr(states, "state_dict") else None}


class Checkpointer:
    """Writes a run's checkpoint: the finished methods' rows and the method in progress."""

    def __init__(self, run_dir: Path, writer: MetricsWriter, methods: dict[str, Any], started: str,
                 resumes: int = 0) -> None:
        self.run_dir, self.writer, self.methods = Path(run_dir), writer, methods
        self.started, self.resumes = started, resumes
        self.done: list[str] = []  # labels of the finished methods (their rows are in ``methods``)

    def save(self, current: dict[str, Any] | None) -> None:
        """Checkpoint now; metrics.csv is flushed first so its length matches the state saved."""
        self.writer.flush()
        write_checkpoint(self.run_dir, {
            "methods": self.methods, "done": list(self.done), "current": current,
            "metrics_offset": self.writer.size(), "torch_rng": torch.get_rng_state(), "started": self.started,
            "resumes": self.resumes,
        })

    def method_done(self, label: str) -> None:
        self.done.append(label)
        self.save(None)
