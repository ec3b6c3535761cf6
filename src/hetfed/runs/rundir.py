"""The run directory: complete, or visibly marked failed — never silently half-written.

Layout::

    config.yaml     the resolved config (defaults filled in)
    status.json     {"status": "running" | "complete" | "failed", ...}
    metrics.csv     tidy rows: method, round, split, client, metric, value
                    (appended and flushed after every evaluation, so an
                    interrupted run keeps what it finished)
    summary.json    written last, only when the run completes
    federation.npz  the clients as the report draws them (class counts, sizes, a 2-D view)
    checkpoints/    best (by validation loss) and final server models; every
                    client's local state (``<method>-clients.pt``) when it has one;
                    what the server sends its clients beside its model, where they
                    predict with it (``<method>-final-served.pt``: each client's row
                    of FedFomo, pFedHN, FedCAC …, FedProto's prototypes)
    figures/        learning curves and who holds which classes (PNG and SVG)
    tb/             TensorBoard logs (tracking: [tensorboard]): one run per method
    tracking.json   the MLflow run ids (tracking: [mlflow]), for a resume
    report.html     one self-contained page: config, federation, curves, tables

A directory that already holds files is never reused: ``--out`` must name a new
or empty directory, so nothing already written is lost.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import json
import os
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from hetfed.errors import RunError
from hetfed.processes import process_alive

#: the files of a run directory and of a sweep directory: this module owns the layout, every other module
#: names a file through these
CONFIG, METRICS, SUMMARY, STATUS = "config.yaml", "metrics.csv", "summary.json", "status.json"
FEDERATION, REPORT = "federation.npz", "report.html"
#: the executor's own log (Flower's lines: the Simulation Engine's, Ray's), handed to it as ``Opening.log_file``
EXECUTOR_LOG = "flower.log"
CHECKPOINTS, FIGURES = "checkpoints", "figures"
#: what the server learnt (leakage.kind): one file of arrays per method row, drawn by report.html
LEAKAGE = "leakage"
SWEEP_RECORD, SWEEP_REQUEST, SWEEP_TABLE = "sweep.json", "sweep_request.json", "sweep.csv"
RUNS_TABLE, CURVES_TABLE, HETEROGENEITY_TABLE = "runs.csv", "curves.csv", "heterogeneity.csv"

METRIC_COLUMNS = ["method", "round", "split", "client", "metric", "value"]


def check_out(out: str | Path | None, flag: str = "--out", what: str = "the run") -> None:
    """Refuse an ``--out`` that is a file or a non-empty directory (before any work is done); ``flag`` and ``what``:
    the option that named the folder and what goes in it, as the refusal names them."""
    if out is None:
        return
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise RunError(f"{flag} {str(path)!r} is a file: expected a new or empty directory for {what}")
    if path.is_dir() and any(path.iterdir()):
        raise RunError(f"{flag} {str(path)!r} already exists and is not empty: choose a new directory "
                       "(hetfed never overwrites a run)")
    _check_writable(path, flag, what)


def _check_writable(path: Path, flag: str, what: str) -> None:
    """Refuse a directory that cannot be made (or written in) before any work is done: a folder is made in its
    nearest existing ancestor and removed. Why make one: ``os.access`` says yes to root for places like /proc, where
    nothing can be made, so only making it tells (the run failed after loading its data and measuring Γ)."""
    ancestor = path.absolute()
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".hetfed-", dir=ancestor))
    except OSError as err:
        raise RunError(f"{flag} {str(path)!r} cannot be created for {what}: {err.strerror} (in {str(ancestor)!r}); "
                       f"expected a writable place (choose another {flag})") from None


def new_run_dir(out: str | Path | None, base: str, name: str) -> Path:
    """Create the run directory (a fresh timestamped one by default)."""
    if out is not None:
        check_out(out)
        path = Path(out)
    else:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path = Path(base) / f"{name}-{stamp}"
        i = 1
        while path.exists():
            path = Path(base) / f"{name}-{stamp}-{i}"
            i += 1
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RunError(
            f"cannot create the run directory {str(path)!r}: {err.strerror}; expected a writable place "
            "(choose another --out)"
        ) from None
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: Path, write: Callable[[IO[Any]], object], binary: bool = False, sync: bool = False) -> None:
    """Write ``path`` through a temporary file in the same folder + rename: readers (and a run resumed
    after a kill) see the old file or the new one, never half of one. ``sync``: on disk before the rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb" if binary else "w") as fh:
            write(fh)
            if sync:
                fh.flush()
                os.fsync(fh.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; the run's other files follow the umask
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temporary file + rename: readers never see half a file."""
    write_atomic(path, lambda fh: json.dump(data, fh, indent=2, default=_jsonable))


def _jsonable(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def read_metric_rows(path: Path, holding: str | None = None) -> Iterator[dict[str, str]]:
    """metrics.csv's rows as its header names them; ``holding``: only the rows whose line holds this text, found
    before any line is parsed (most of a run's rows are its clients' own: a reader of a few metrics or of the summary
    rows skips them unparsed)."""
    with open(path, newline="") as fh:
        fields = next(csv.reader([fh.readline()]), METRIC_COLUMNS)
        lines = fh if holding is None else (line for line in fh if holding in line)
        yield from csv.DictReader(lines, fieldnames=fields)


#: the types whose ``repr`` is what the csv module writes for them (a numpy number's is not: ``np.float64(0.5)``)
_PLAIN = frozenset({float, int, bool})


@functools.lru_cache(maxsize=4096)  # a run's labels and metric names, the same every round
def _csv_field(text: str) -> str:
    """``text`` as the csv module's default dialect writes a field of a row of several: quoted, its quotes doubled,
    where it holds a comma, a quote or a line break."""
    return '"' + text.replace('"', '""') + '"' if any(c in text for c in ',"\r\n') else text


class MetricsWriter:
    """Append tidy metric rows to metrics.csv, flushed after every batch.

    ``keep_bytes`` (resuming a run): keep the file's first ``keep_bytes`` bytes — the rows
    its checkpoint covers — and append after them; None starts the file afresh.
    """

    def __init__(self, path: Path, keep_bytes: int | None = None):
        self.path = path
        #: experiment trackers (:class:`hetfed.runs.tracking.Trackers`): round-level rows mirrored as written
        self.mirror: Any = None
        if keep_bytes is not None and path.is_file():
            with open(path, "r+b") as fh:
                fh.truncate(keep_bytes)
            self._fh = open(path, "a", newline="")  # noqa: SIM115 - held open for streaming
            self._w = csv.writer(self._fh)
            return
        self._fh = open(path, "w", newline="")  # noqa: SIM115 - held open for streaming
        self._w = csv.writer(self._fh)
        self._w.writerow(METRIC_COLUMNS)
        self._fh.flush()

    def write(self, method: str, round: int, split: str, client: int | str, metrics: dict[str, float]) -> None:
        self._rows(method, round, split, [(client, metric, value) for metric, value in metrics.items()])
        if self.mirror is not None and client == "all":
            self.mirror.log(method, round, split, metrics)

    def write_clients(self, method: str, round: int, per_client: dict[str, list[float]], split: str = "client"
                      ) -> None:
        """Every client's value of each metric (``per_client[metric][k]``: client k's), one row each, in one call
        (an evaluation of 10 clients writes ~70 rows; one call each was a tenth of a small model's round). A metric
        whose values are all plain numbers is written as the csv module writes it, its head made once (127 → 83 µs for
        10 clients' rows); any other through the csv module."""
        head, text = f"{_csv_field(method)},{round},{_csv_field(split)},", []
        for metric, values in per_client.items():
            if {type(value) for value in values} <= _PLAIN:
                middle = f",{_csv_field(metric)},"
                text += [f"{head}{k}{middle}{value!r}\r\n" for k, value in enumerate(values)]
            else:
                self._fh.write("".join(text))
                text = []
                self._w.writerows([method, round, split, k, metric, value] for k, value in enumerate(values))
        self._fh.write("".join(text))

    def _rows(self, method: str, round: int, split: str, rows: list[tuple[int | str, str, Any]]) -> None:
        """Rows of ``(client, metric, value)`` (:meth:`write`'s). When every value is a plain number (a float, an int:
        a round's client counts and bytes) they are written as the csv module writes them, as one string (2.5× faster
        than the module; a round's counts went through it, ~0.1 ms a run a round); otherwise through the csv
        module."""
        if {type(value) for _, _, value in rows} <= _PLAIN:
            head = f"{_csv_field(method)},{round},{_csv_field(split)},"
            self._fh.write("".join([f"{head}{_csv_field(str(client))},{_csv_field(metric)},{value!r}\r\n"
                                    for client, metric, value in rows]))
        else:
            self._w.writerows([method, round, split, client, metric, value] for client, metric, value in rows)

    def flush(self, durable: bool = True) -> None:
        """Hand the rows to the OS (other processes, and a run killed after this, see them); ``durable``: also to
        the disk (fsync), what a checkpoint needs — its recorded offset must survive the machine, not only the
        process. An evaluation's rows need not wait for the disk (an fsync a round: up to milliseconds each)."""
        self._fh.flush()
        if durable:
            os.fsync(self._fh.fileno())
        if self.mirror is not None:
            self.mirror.flush()

    def duplicate(self) -> int:
        """A duplicate of the file's descriptor (the caller closes it): for syncing it to disk from another thread,
        whatever this writer does meanwhile (:meth:`hetfed.runs.checkpoint.Checkpointer.save`)."""
        return os.dup(self._fh.fileno())

    def size(self) -> int:
        """Bytes written so far (after :meth:`flush`)."""
        return os.path.getsize(self.path)

    def close(self) -> None:
        if not self._fh.closed:
            self._fh.flush()
            os.fsync(self._fh.fileno())  # a finished run's rows on disk before its summary says it is complete
            self._fh.close()


def environment() -> dict[str, Any]:
    """Versions, machine and threads a run was made with (for its report and for reproducing it): the CPU's model
    and vector width (a run's numbers round by it, its timings depend on it), the cores the process could use (a
    container's quota) and, where the ``hetfed`` command judged them, those other processes left idle."""
    import torch

    from hetfed.engine import host_threads

    idle = {} if host_threads.IDLE is None else {"cores_idle_at_start": host_threads.IDLE}
    return {**_process_environment(), "torch_threads": torch.get_num_threads(), **idle}


def cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``'s on Linux, where ``platform.processor()`` is empty), or None."""
    import platform

    try:
        with open("/proc/cpuinfo") as fh:
            return next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), None)
    except OSError:
        return platform.processor() or None


@functools.cache
def _process_environment() -> dict[str, Any]:
    """What :func:`environment` says that a process does not change: read once (the packages' metadata, ~15 ms,
    once a run of a sweep before). Imports torch (and hetfed.streams, which needs it) here: ``import hetfed``
    stays light."""
    import platform
    import sys
    from importlib import metadata

    import torch

    from hetfed import streams

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    env = {
        "hetfed": version("hetfed"), "random_streams": streams.GENERATOR,
        "python": sys.version.split()[0], "torch": torch.__version__,
        **{name: version(name) for name in ("numpy", "scipy", "scikit-learn", "numba", "flwr")},
        "platform": platform.platform(), "machine": platform.machine(), "host": socket.gethostname(),
        "cpu": cpu_model(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_count": os.cpu_count(), "cores_allowed": _allowed_cores(),
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    return {k: v for k, v in env.items() if v is not None}


def _allowed_cores() -> int | None:
    """The cores the process may use (:func:`hetfed.engine.host_threads.allowed_cores`), None where that cannot be
    read (a ``LOKY_MAX_CPU_COUNT`` the command would refuse, in a library call)."""
    from hetfed.engine.host_threads import allowed_cores
    from hetfed.errors import ConfigError

    try:
        return allowed_cores()
    except ConfigError:
        return None


def set_status(run_dir: Path, status: str, **info: Any) -> None:
    """Write status.json; a running run also records who runs it and a heartbeat.

    ``pid``, ``host`` and ``heartbeat`` let :func:`run_state` tell a live run from one
    killed without a chance to say so (SIGKILL, a lost machine).
    """
    now = time.strftime("%Y-%m-%dT%H:%M:%S")
    record: dict[str, Any] = {"status": status, "time": now}
    if status == "running":
        record.update(pid=os.getpid(), host=socket.gethostname(), heartbeat=time.time())
    write_json_atomic(run_dir / STATUS, {**record, **info})


def failure_reason(run_dir: Path) -> str | None:
    """Why a failed run stopped, as its status.json says (the error's own message, without its type), or None
    (no status, or not failed): what a command that ran the run elsewhere (a ServerApp) reports."""
    try:
        record = json.loads((run_dir / STATUS).read_text())
    except (OSError, ValueError):
        return None
    reason = record.get("reason") if record.get("status") == "failed" else None
    if not isinstance(reason, str) or not reason:
        return None
    kind, _, message = reason.partition(": ")
    return message if message and kind.isidentifier() and kind[0].isupper() else reason


class Heartbeat:
    """Refresh a running run's status.json every ``every_s`` seconds while the run lives.

    :meth:`start` refreshes it from a daemon timer thread, so a slow Flower round or a long
    evaluation never leaves the heartbeat stale (another host would call a live run dead
    after :data:`STALE_AFTER_S`); :meth:`beat` records what the run is doing (and writes at
    most every ``every_s``); :meth:`stop` ends the timer before the final status is written.
    """

    def __init__(self, run_dir: Path, every_s: float = 5.0, **info: Any):
        self.run_dir, self.every_s, self.info = run_dir, every_s, info
        self._last = 0.0
        self._lock = threading.RLock()  # a signal's handler may stop it on the thread inside beat()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self, **info: Any) -> None:
        if not info and time.monotonic() - self._last < self.every_s:
            return  # nothing new, and not due (every round of every run of a sweep beats: no lock for that)
        with self._lock:
            self.info.update(info)
            now = time.monotonic()
            if now - self._last >= self.every_s and not self._stopped.is_set():
                self._last = now
                set_status(self.run_dir, "running", **self.info)

    def _write(self) -> None:
        with self._lock:
            if not self._stopped.is_set():
                self._last = time.monotonic()
                set_status(self.run_dir, "running", **self.info)

    def start(self) -> None:
        """Write the heartbeat now and every ``every_s`` seconds until :meth:`stop`."""
        self._write()

        def loop() -> None:
            while not self._stopped.wait(self.every_s):
                # a full disk must not kill the run from a side thread; the next beat retries
                with contextlib.suppress(OSError):
                    self._write()

        self._thread = threading.Thread(target=loop, name="hetfed-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._stopped.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.every_s + 1)


#: a running run whose heartbeat is older than this is presumed dead (seconds)
STALE_AFTER_S = 600.0


def run_state(run_dir: str | Path) -> str:
    """``complete``, ``failed``, ``running``, ``dead`` (marked running but its process is gone), or ``unknown``."""
    path = Path(run_dir) / STATUS
    try:
        status = json.loads(path.read_text())
    except (OSError, ValueError):
        return "unknown"
    state = str(status.get("status", "unknown"))
    if state != "running":
        return state
    if status.get("host") == socket.gethostname() and status.get("pid") is not None:
        return "running" if process_alive(int(status["pid"])) else "dead"
    beat = status.get("heartbeat")
    return "running" if beat is not None and time.time() - float(beat) < STALE_AFTER_S else "dead"


def read_summary(run_dir: str | Path) -> dict[str, Any]:
    """The summary of a completed run; a clear error for an incomplete one."""
    path = Path(run_dir) / SUMMARY
    if not path.is_file():
        state = run_state(run_dir)
        if state == "dead":
            state = "dead: marked running, but its process is gone"
        raise RunError(f"{str(run_dir)!r} is not a completed run (status: {state})")
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded
