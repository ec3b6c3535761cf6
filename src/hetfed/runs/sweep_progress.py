"""A sweep's progress lines: how many runs it trains and how, each run's rounds every 10 s, runs done, failed and
left with an ETA — for a stacked sweep, its runs ready and its rounds trained (:class:`SweepProgress`)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from hetfed.console import LogProgress, make_console, print_loading
from hetfed.runs.sweep_tables import point_name


@dataclass(frozen=True)
class RunLines:
    """Where a sweep's run tells its rounds: a line every 10 s of a method's rounds (none for a shorter one), after
    the run's place in the sweep — a long run was silent until it ended, and so was the sweep's ETA, which comes from
    runs done. Plain data: a worker process makes its own console (on the sweep's stream)."""

    prefix: str
    stderr: bool = False

    def display(self, console: Console | None = None) -> LogProgress:
        return LogProgress(console or make_console(stderr=self.stderr), prefix=self.prefix, ends=False)


class SweepProgress:
    """One display over the whole grid: runs done, failed and remaining, and an ETA. A stacked sweep's runs finish
    together, so its ETA comes from the rounds the stack has trained (:meth:`stacked_round`), not from runs done —
    and, when every run's rounds have a ``time_limit``, from what is left of it once that comes first."""

    def __init__(self, total: int, reused: int, console: Console | None, stacked: bool = False,
                 time_limit: float | None = None, measures_gamma: bool = False):
        self.total, self.done, self.failed, self.console = total, reused, 0, console
        #: the runs measure Γ before their rounds: a slow preparation's line says how to leave it out
        self.measures_gamma = measures_gamma
        self.time_limit = time_limit
        self.rounds_from: float | None = None  # when the method's first round ended (its runs' clocks ≈ started)
        self.t0 = time.perf_counter()
        #: when the method training now began: the sweep's start for its first, the previous method's last round
        #: for the next (its rounds' pace is the ETA's basis, not the whole sweep's time over this method's rounds)
        self.method_t0 = self.t0
        self._last_round = self.t0
        self.timed = 0  # runs finished in this session (the ETA's basis)
        self.stacked = stacked
        self.rounds: tuple[int, int] | None = None  # a stacked sweep's (round trained, rounds of its longest run)
        self._shown = self.t0
        self._said: set[str] = set()
        if console and reused:
            console.print(f"{reused} of {total} runs reused from the earlier sweep", soft_wrap=True)

    def begin(self, todo: int, how: str) -> None:
        """The sweep's first line: how many runs it trains, and how, before any of them reports (a stacked sweep's
        runs prepare their clients before their first round — minutes on a large dataset — and said nothing)."""
        if self.console is not None and todo:
            self.console.print(f"{time.strftime('%H:%M:%S')} [{todo} runs to train, {how}]", soft_wrap=True)

    def started(self, point: dict[str, Any], seed: int) -> None:
        return None

    def within(self, place: int, point: dict[str, Any], seed: int) -> RunLines | None:
        """Where the run at ``place`` (1-based, of the sweep's runs) tells its rounds (None: a quiet sweep)."""
        if self.console is None:
            return None
        return RunLines(f"[run {place}/{self.total}, {point_name(point)} seed={seed}] ", self.console.stderr)

    def _new(self, line: str) -> bool:
        """Whether this sweep has not printed ``line`` yet."""
        fresh = line not in self._said
        self._said.add(line)
        return fresh

    def stacked_ready(self, ready: int, members: int) -> None:
        """``ready`` of a stacked sweep's ``members`` runs are ready for their rounds, which start when all are: a
        line at most every 10 s (its runs prepare their clients in turn: minutes on a large dataset)."""
        now = time.perf_counter()
        if self.console is None or now - self._shown < 10:
            return
        self._shown = now
        gamma = "; each measures Γ first: --set heterogeneity.gamma=false leaves it out" if self.measures_gamma else ""
        self.console.print(f"{time.strftime('%H:%M:%S')} [stacked, {members} runs: {ready} ready for their rounds, "
                           f"which start when every run is{gamma}]", soft_wrap=True)

    def stacked_round(self, done: int, total: int) -> None:
        """A stacked sweep's stack trained round ``done`` of ``total``: a line at most every 10 s."""
        now = time.perf_counter()
        if self.rounds_from is None or (self.rounds is not None and done < self.rounds[0]):
            self.rounds_from = now  # the first round of the sweep's (next) method
            if self.rounds is not None:
                self.method_t0 = self._last_round
        self.rounds, self._last_round = (done, total), now
        if self.console is None or now - self._shown < 10 or done <= 0:
            return
        self._shown = now
        self.console.print(f"{time.strftime('%H:%M:%S')} [stacked, {self.total - self.done} runs: round {done}/{total} "
                           f"of the method training now, its {self._rounds_eta()}]", soft_wrap=True)

    def _rounds_eta(self) -> str:
        """A stacked sweep's ETA for the method training now, from the pace of the rounds its stack has trained."""
        assert self.rounds is not None
        done, total = self.rounds
        now = time.perf_counter()
        eta = (now - self.method_t0) / done * max(total - done, 0)
        if self.time_limit is not None and self.rounds_from is not None:
            left = max(self.time_limit - (now - self.rounds_from), 0.0)
            if left < eta:
                return f"ETA {_duration(left)} (train.time_limit)"
        return f"ETA {_duration(eta)}"

    def _eta(self, remaining: int) -> str:
        if not self.stacked:
            return f"ETA {_duration((time.perf_counter() - self.t0) / self.timed * remaining)}"
        if remaining and self.rounds and self.rounds[0] < self.rounds[1]:
            return f"this method's {self._rounds_eta()}"
        return "the rest finish with it" if remaining else "done"

    def finished(self, point: dict[str, Any], seed: int, outcome: tuple[str, object]) -> None:
        self.done += 1
        self.timed += 1
        status, value = outcome
        if status != "ok":
            self.failed += 1
        if self.console is None:
            return
        if status == "ok" and isinstance(value, dict):  # what loading did and warned: once a sweep, not once a run
            notes, warns = value.get("data_notes", []), value.get("warnings", [])
            print_loading(self.console, [n for n in notes if self._new(n)], [w for w in warns if self._new(w)])
        remaining = self.total - self.done
        line = (f"{time.strftime('%H:%M:%S')} [{self.done}/{self.total} done, {self.failed} failed, {remaining} left, "
                f"{self._eta(remaining)}] {point_name(point)} seed={seed}: {status}")
        self.console.print(line + (f" — {value}" if status != "ok" else ""), style=None if status == "ok" else "red",
                           soft_wrap=True)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    return (
        f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"
    )
