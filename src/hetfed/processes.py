"""Processes: whether one of this machine still runs — what a run directory's status, a local deployment and a
node's worker ask of the processes they watch —, this one stopping at once, its runs' last words said, and the memory
the machine can still give it (the lowest layer: the standard library only)."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import NoReturn

#: what :func:`exit_now` tells before the process ends: each run in progress marks its directory failed
_LAST_WORDS: list[Callable[[BaseException], object]] = []


@contextlib.contextmanager
def last_words(say: Callable[[BaseException], object]) -> Iterator[None]:
    """While inside, :func:`say_last_words` (and :func:`exit_now`) calls ``say(why)`` before the process ends (a run
    marks itself failed)."""
    _LAST_WORDS.append(say)
    try:
        yield
    finally:
        _LAST_WORDS.remove(say)


def once(say: Callable[[BaseException], object]) -> Callable[[BaseException], None]:
    """``say`` called at most once: a run's last words said from a signal's handler and again by its own ``except``
    as the stop unwinds it mark it failed once."""
    said: list[BaseException] = []

    def say_once(why: BaseException) -> None:
        if not said:
            said.append(why)
            say(why)

    return say_once


def say_last_words(why: BaseException) -> None:
    """Each :func:`last_words` in force (latest first) told ``why``; one that fails does not stop the others."""
    for say in reversed(_LAST_WORDS):
        with contextlib.suppress(Exception):
            say(why)


def exit_now(code: int, why: BaseException, line: str) -> NoReturn:
    """End this process at once with exit status ``code``, without unwinding its threads or its libraries' clean-up,
    after each :func:`last_words` (latest first, told ``why``) and ``line`` on stderr. For a second Ctrl-C or SIGTERM
    while a Flower simulation stops: unwinding there runs Flower's own stop, which can shut Ray down under a thread
    still waiting on it, and Ray then ends the process with exit status 1 (:mod:`hetfed.flower.simulation`, which
    kills Ray's processes first: its agents outlive a driver that exits)."""
    say_last_words(why)
    with contextlib.suppress(Exception):
        sys.stderr.write(f"{line}\n")
        sys.stderr.flush()
    os._exit(code)


def process_alive(pid: int) -> bool:
    """Whether the process runs: a zombie (killed, not yet reaped by its parent — a ServerApp killed under
    Flower's SuperExec stays one) is dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:  # no /proc (not Linux): the signal answered
        return True


def descendants(pid: int | None = None) -> set[int]:
    """Every process below ``pid`` (this one by default), read from /proc (Linux; elsewhere: none found)."""
    children: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.scandir("/proc"):
            if entry.name.isdigit():
                with contextlib.suppress(OSError, IndexError, ValueError), open(f"{entry.path}/stat") as fh:
                    children.setdefault(int(fh.read().rsplit(")", 1)[1].split()[1]), []).append(int(entry.name))
    found, todo = set(), [os.getpid() if pid is None else pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def signal_all(pids: Iterable[int], signum: int) -> None:
    """``signum`` sent to each of ``pids``; one that has gone meanwhile (or is not ours to signal) is skipped."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


def available_memory() -> int | None:
    """Bytes the system can still give this process (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None
