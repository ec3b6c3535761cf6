"""One exchange with the nodes: messages pushed to Flower's grid and their replies pulled, polling from 10 ms
(Flower's own ``GrpcGrid.send_and_receive`` sleeps 3 s between polls). Only Flower's public ``push_messages`` /
``pull_messages`` are used; :class:`~hetfed.flower.executor.FlowerExecutor` and own-data discovery exchange
through it."""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from flwr.app import Message

from hetfed.flower.audit import append

#: first and longest wait between two polls for replies (seconds); the wait doubles while nothing comes
POLL_FIRST, POLL_LONGEST = 0.01, 0.5

#: grids whose nodes will never answer (their Simulation Engine stopped, or the run was asked to stop), each with
#: what a poll of it raises: it fails at once instead of waiting out its timeout (``flower.connect_timeout``,
#: minutes), which kept a failed run's process alive
_abandoned: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: grids that have delivered a reply: the run has begun on them, so starting it again would repeat it
_answered: weakref.WeakSet = weakref.WeakSet()


class Abandoned(RuntimeError):
    """The grid's nodes will never answer: its Simulation Engine stopped while the ServerApp waited for them."""


def abandon(grid, why: BaseException | None = None) -> None:
    """No more waiting for replies on ``grid``: a poll of it, now or later, raises ``why`` (by default
    :class:`Abandoned`; a signal's :class:`~hetfed.errors.Terminated` or ``KeyboardInterrupt`` stops the ServerApp
    as the signal would have stopped the run)."""
    _abandoned.setdefault(grid, why if why is not None else Abandoned(
        "Flower's Simulation Engine stopped while the ServerApp waited for the nodes' replies"))


def answered(grid) -> bool:
    """Whether ``grid`` has delivered a reply to a poll."""
    return grid in _answered


def send_and_receive(grid, messages: list[Message], timeout: float | None) -> list[Message]:
    """Push ``messages`` and pull their replies until all came or ``timeout`` passed — Flower's own
    ``Grid.send_and_receive``, but polling from 10 ms and backing off to 0.5 s: a deployment's grid
    (``GrpcGrid``) sleeps 3 s between polls, which made every round of a loopback deployment cost
    several seconds of waiting however fast the clients answered. Only Flower's public
    ``push_messages`` / ``pull_messages`` are used. With ``HETFED_FLOWER_TIMING`` set, the exchange's push and
    last reply are logged there (``benchmarks/engines.py``: the server's time between exchanges)."""
    return receive(grid, push(grid, messages, timeout))


@dataclass
class Pushed:
    """Messages pushed to the grid and their replies pulled so far (:func:`receive`)."""

    pending: set[str]  # the ids of the messages whose replies are still to be pulled
    pushed: float  # time.time() of the push
    end: float | None  # time.monotonic() after which their replies are no longer awaited
    kinds: list[str]
    got: list[Message] = field(default_factory=list)  # replies already pulled

    def done(self) -> bool:
        """Every reply came, or their time passed."""
        return not self.pending or (self.end is not None and time.monotonic() >= self.end)


def push(grid, messages: list[Message], timeout: float | None) -> Pushed:
    """Push ``messages`` now; their replies are awaited until ``timeout`` seconds from now."""
    return Pushed(set(grid.push_messages(messages)), time.time(),
                  None if timeout is None else time.monotonic() + timeout,
                  sorted({m.metadata.message_type for m in messages}))


def receive(grid, pushed: Pushed) -> list[Message]:
    """Pull the replies to ``pushed`` until all came or its time passed (:func:`send_and_receive`'s polling),
    those pulled before included."""
    poll(grid, [pushed], pushed.done)
    append("HETFED_FLOWER_TIMING", {"type": "server", "pushed": pushed.pushed, "replied": time.time(),
                                    "kinds": pushed.kinds})
    return list(pushed.got)


def poll(grid, pushes: list[Pushed], done: Callable[[], bool]) -> None:
    """Pull the replies to ``pushes`` (each into its own ``got``) until ``done()`` after a pull: polling from
    :data:`POLL_FIRST`, the wait doubling to :data:`POLL_LONGEST` while nothing comes, never past a push's end."""
    wait = POLL_FIRST
    while True:  # pulled at least once: a push whose time passed still gets what already came
        if (why := _abandoned.get(grid)) is not None:
            raise why
        waiting = set().union(*(p.pending for p in pushes))
        got = list(grid.pull_messages(waiting)) if waiting else []
        if got:
            _answered.add(grid)
        for m in got:
            for p in pushes:
                if m.metadata.reply_to_message_id in p.pending:
                    p.pending.discard(m.metadata.reply_to_message_id)
                    p.got.append(m)
        if done():
            return
        ends = [p.end for p in pushes if p.end is not None]
        time.sleep(wait if not ends else max(0.0, min(wait, min(ends) - time.monotonic())))
        wait = POLL_FIRST if got else min(2 * wait, POLL_LONGEST)
