"""The run directory: complete, or visibly marked failed — never silently half-written.

Layout::

    config.yaml     the resolved config (defaults filled in)
    status.json     {"status": "running" | "complete" | "failed", ...}
    metrics.csv     tidy rows: method, round, split, client, metric, value
                    (appended and flushed after every evaluation, so an
                    interrupted run keeps what it finished)
    summary.json    written last, only when the run completes
    checkpoints/    best (by validation loss) and final server models
    figures/        learning curves

A directory that already holds files is never reused: ``--out`` must name a new
or empty directory, so nothing already written is lost.
"""

from __future__ import annotations

import csv
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from hetfed.errors import RunError

METRIC_COLUMNS = ["method", "round", "split", "client", "metric", "value"]


def new_run_dir(out: str | Path | None, base: str, name: str) -> Path:
    """Create the run directory (a fresh timestamped one by default)."""
    if out is not None:
        path = Path(out)
        if path.exists() and (not path.is_dir() or any(path.iterdir())):
            raise RunError(
                f"--out {str(path)!r} already exists and is not empty: choose a new directory "
                "(hetfed never overwrites a run)"
            )
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path(base) / f"{name}-{stamp}"
        i = 1
        while path.exists():
            path = Path(base) / f"{name}-{stamp}-{i}"
            i += 1
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temporary file + rename: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        json.dump(data, fh, indent=2, default=_jsonable)
    os.replace(tmp, path)


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


class MetricsWriter:
    """Append tidy metric rows to metrics.csv, flushed after every batch."""

    def __init__(self, path: Path):
        self.path = path
        self._fh = open(path, "w", newline="")  # noqa: SIM115 - held open for streaming
        self._w = csv.writer(self._fh)
        self._w.writerow(METRIC_COLUMNS)
        self._fh.flush()

    def write(self, method: str, round: int, split: str, client: int | str, metrics: dict[str, float]) -> None:
        for metric, value in metrics.items():
            self._w.writerow([method, round, split, client, metric, value])

    def flush(self) -> None:
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.close()


def set_status(run_dir: Path, status: str, **info: Any) -> None:
    write_json_atomic(run_dir / "status.json", {"status": status, "time": time.strftime("%Y-%m-%dT%H:%M:%S"), **info})


def read_summary(run_dir: str | Path) -> dict:
    """The summary of a completed run; a clear error for an incomplete one."""
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        status = Path(run_dir) / "status.json"
        state = json.loads(status.read_text())["status"] if status.is_file() else "unknown"
        raise RunError(f"{str(run_dir)!r} is not a completed run (status: {state})")
    return json.loads(path.read_text())
