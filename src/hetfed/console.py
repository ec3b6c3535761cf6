"""Terminal output: consoles that never read user text as markup, and progress that
also works when output goes to a file.

Two rules hold everywhere hetfed prints:

- **No markup in user text.** Consoles are made with ``markup=False``: a value such
  as ``hetfed[vision]`` or ``[b]x`` is printed as written. Colour comes from
  ``style=`` only.
- **Progress in logs too.** A rich progress bar only shows on a terminal; when
  stdout is redirected (nohup, cluster logs) the same calls print plain,
  time-stamped lines at a bounded rate, so a log shows that a long run is alive.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

#: width of tables and lines written to a file or pipe (rich's default there is 80)
LOG_WIDTH = 240
#: at most one progress line per task this often when not on a terminal (seconds)
LOG_EVERY_S = 10.0


def make_console(stderr: bool = False) -> Console:
    """A console that prints user text literally and does not cut tables in logs."""
    stream = sys.stderr if stderr else sys.stdout
    terminal = bool(getattr(stream, "isatty", lambda: False)())
    return Console(stderr=stderr, markup=False, highlight=False, width=None if terminal else LOG_WIDTH)


class LogProgress:
    """rich.Progress's task interface, printed as plain lines (for files and pipes).

    A line per task at most every ``every_s`` seconds, plus its first and last
    update, so a log shows what runs and how fast without flooding. ``ends`` False: only the lines every
    ``every_s`` seconds, none for a task shorter than that (a sweep's runs, whose ends the sweep's own lines tell),
    each after ``prefix``.
    """

    def __init__(self, console: Console, every_s: float = LOG_EVERY_S, unit: str = "rounds", prefix: str = "",
                 ends: bool = True):
        self.console = console
        self.every_s = every_s
        self.unit = unit
        self.prefix, self.ends = prefix, ends
        self._tasks: dict[int, dict[str, Any]] = {}

    def __enter__(self) -> LogProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def add_task(self, description: str, total: float | None = None, **fields: Any) -> int:
        task_id, now = len(self._tasks), time.perf_counter()
        self._tasks[task_id] = {"description": description, "total": total, "completed": 0,
                                "start": now, "last": None if self.ends else now, "fields": fields}
        return task_id

    def update(self, task_id: int, completed: float | None = None, total: float | None = None, **fields: Any) -> None:
        task = self._tasks[task_id]
        task["fields"].update(fields)
        if total is not None:  # as rich's: a task that ends before its total (a run stopped early)
            task["total"] = total
        if completed is not None:
            task["completed"] = completed
        now = time.perf_counter()
        done = task["total"] is not None and task["completed"] >= task["total"]
        due = task["last"] is None or now - task["last"] >= self.every_s
        if not (due or done and self.ends) or task.get("finished"):
            return
        task["last"] = now
        task["finished"] = done
        of = f"/{task['total']:g}" if task["total"] is not None else ""
        fields = dict(task["fields"])
        unit = self.unit
        if fields.get("rate") in ("clients", "epochs"):  # a task counting clients, not rounds
            unit = fields.pop("rate")
        extra = " · ".join(f"{k} {str(v).strip()}" for k,
                           v in fields.items() if str(v).strip() and str(v).strip() != "-")
        line = (f"{time.strftime('%H:%M:%S')} {self.prefix}{task['description']}: {unit} {task['completed']:g}{of}"
                f" · {now - task['start']:.0f} s" + (f" · {extra}" if extra else ""))
        self.console.print(line, soft_wrap=True)


#: a terminal narrower than this gets no throughput column (the bar, counts, accuracy and times fit 80 columns)
RATE_MIN_WIDTH = 110


def round_progress(enabled: bool, console: Console) -> Progress | LogProgress:
    """The progress display of training rounds: a bar on a terminal, log lines otherwise.

    Tasks carry the fields ``acc`` (the last evaluated global accuracy, or ``-``) and ``rate``
    (throughput, shown from :data:`RATE_MIN_WIDTH` columns). At 80 columns a line is
    ``   relu ━━━━━━━━━━ 100/100 acc 0.812 elapsed 0:00:12 ETA 0:00:00``.
    """
    if enabled and not console.is_terminal:
        return LogProgress(console)
    wide = console.width >= RATE_MIN_WIDTH
    return Progress(
        TextColumn("{task.description:>12.12}", markup=False),
        BarColumn(bar_width=None if wide else 12),
        MofNCompleteColumn(),
        TextColumn("acc {task.fields[acc]:>5}", markup=False),
        TextColumn("elapsed", markup=False), TimeElapsedColumn(),
        TextColumn("ETA", markup=False), TimeRemainingColumn(),
        *([TextColumn("{task.fields[rate]}", markup=False)] if wide else []),
        console=console,
        disable=not enabled,
    )


@contextmanager
def stage(console: Console | None, what: str) -> Iterator[None]:
    """Show a long step (loading, embedding, partitioning, Γ) while it runs.

    A transient spinner on a terminal; a start and an end line with the seconds
    taken when the output goes to a file.
    """
    if console is None:
        yield
        return
    if console.is_terminal:
        with console.status(what):
            yield
        return
    t0 = time.perf_counter()
    console.print(f"{time.strftime('%H:%M:%S')} {what} …", soft_wrap=True)
    yield
    console.print(f"{time.strftime('%H:%M:%S')} {what}: done in {time.perf_counter() - t0:.1f} s", soft_wrap=True)


def print_loading(console: Console, notes: Iterable[str], warnings: Iterable[str]) -> None:
    """What loading did and what makes parts of the report meaningless, on the console. A note is the data's own
    text (class names, play and role names), a warning may quote it: printed as it is, never read as Rich markup,
    whatever console the caller passes."""
    for note in notes:
        console.print(note, soft_wrap=True, markup=False)
    for warning in warnings:
        console.print(f"warning: {warning}", style="yellow", soft_wrap=True, markup=False)
