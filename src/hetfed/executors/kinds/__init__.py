"""The executor registry: what ``train.executor`` names — where a run's clients compute, opened by the run driver.

An executor kind is one module of this package that registers a :class:`ExecutorKind`. The driver
(:mod:`hetfed.runs.runner`) never names one: it opens the kind a method's ``train.executor`` names (or the one it
was handed: a Flower ServerApp hands its deployment) as a context manager, and the session runs the driver's
loop over that kind's methods, giving it each method's client-step executor
(:class:`~hetfed.executors.inprocess.Executor`). Starting what the clients need — Ray for Flower's Simulation
Engine — and stopping it is the kind's job.

Flower's Simulation Engine runs the ServerApp on a thread of its own and Ray on the caller's: the session
therefore runs the driver's loop inside the ServerApp (:meth:`Session.run`) rather than handing a Grid out.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol, TypeVar

from hetfed.config import Config, TrainConfig
from hetfed.errors import RunError
from hetfed.executors.inprocess import Executor
from hetfed.registry import Registry

T = TypeVar("T")

#: method index (in ``config.methods``) → the client-step executor that method's rounds use
ClientSteps = Callable[[int], Executor]


@dataclass(frozen=True)
class Opening:
    """What an executor is opened with: the run's config, the federation's size, the file its own engine's log
    lines go to (None: nowhere but errors on the console)."""

    config: Config
    n_clients: int
    log_file: Path | None = None
    status: Any = None  # a console told what takes long (Ray's start), or None


class Session(Protocol):
    def run(self, loop: Callable[[ClientSteps], T]) -> T:
        """``loop(steps)`` run where the clients are reachable; its value returned."""
        ...


class ExecutorKind:
    """One registered executor. Its capabilities are data the driver reads instead of the name:

    ``in_process``: the clients live in this process — their memory is checked before a run, attacks can be
    simulated, checkpoints hold every client's state (else the clients' state lives on the nodes and a resume
    mid-rounds is exact only for methods whose clients keep nothing); ``selectable``: ``train.executor`` may
    name it (a deployment is handed to the driver by the ServerApp instead); ``stacks_runs``: a sweep may hand
    it to several runs at once (``--stack``); ``stackable``: a run configured with this kind computes what the
    stacking kind computes for it, so ``--stack`` may take its place (the others are refused with ``--stack``, never
    replaced silently).
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    in_process: ClassVar[bool] = True
    selectable: ClassVar[bool] = True
    #: runs several runs' client steps as one stack (:meth:`for_runs`, :meth:`leave`): a stacked sweep's kind
    stacks_runs: ClassVar[bool] = False
    #: ``--stack`` may run a method configured with this kind (it computes the same stacks the stacking kind does)
    stackable: ClassVar[bool] = False
    #: ``train`` keys this kind does not read, each with why (a note names a typed one: ``hetfed.config.unread_keys``)
    unread_train: ClassVar[dict[str, str]] = {}

    def check(self) -> None:
        """Refuse, in one line, what this kind needs that this machine lacks (a missing extra): called by the plan,
        before any run directory is made."""
        return None

    def for_runs(self, members: int, on_round: Callable[[int, int], object] | None = None,
                 on_ready: Callable[[int, int], object] | None = None) -> ExecutorKind:
        """A kind shared by ``members`` runs on threads of this process (kinds that ``stacks_runs``);
        ``on_round(round, rounds)`` is told each round the stack trains, ``on_ready(ready, members)`` each time a run
        is ready for rounds the others are not yet (progress)."""
        raise RunError(f"executor {self.name!r} trains one run at a time")

    def join(self) -> None:
        """A run that was handed :meth:`for_runs`' kind starts (on its own thread, before anything else)."""
        return None

    def leave(self) -> None:
        """A run that was handed :meth:`for_runs`' kind is done (finished or failed): the others stop waiting."""
        return None

    def serve(self) -> None:
        """Called by the thread that handed :meth:`for_runs`' kind to the runs, once they are started: it computes
        for them until every run has left (kinds that ``stacks_runs``; the others return at once)."""
        return None

    def client_steps(self, train: TrainConfig) -> Executor:
        """The client-step executor of a method trained with ``train`` in this process (in-process kinds)."""
        raise RunError(f"train.executor = {self.name!r} runs its clients through a session: run it with hetfed run "
                       "(hetfed.runs.runner), which opens it")

    @contextmanager
    def open(self, opening: Opening) -> Iterator[Session]:
        """The kind's session for one run: started on entry, stopped on exit whatever happened."""
        yield InProcessSession(self, opening.config)


@dataclass(frozen=True)
class InProcessSession:
    """The clients are in this process: ``loop`` runs here, each method with a fresh executor of ``kind``."""

    kind: ExecutorKind
    config: Config

    def run(self, loop: Callable[[ClientSteps], T]) -> T:
        return loop(self.steps)

    def steps(self, index: int) -> Executor:
        return self.kind.client_steps(self.config.method_train(self.config.methods[index]))


def _described(kind: ExecutorKind) -> dict[str, Any]:
    return {"summary": kind.summary, "in_process": kind.in_process, "selectable": kind.selectable,
            "stacks_runs": kind.stacks_runs, "stackable": kind.stackable}


#: every executor, by ``train.executor`` (one module of this package each)
EXECUTORS: Registry[ExecutorKind] = Registry("executor", __name__, "train.executor", describe=_described)


def register(kind: type[ExecutorKind]) -> type[ExecutorKind]:
    """Register an executor kind (an instance of it is what the registry holds)."""
    EXECUTORS.register(kind.name, kind())
    return kind


def executor_for(train: TrainConfig) -> ExecutorKind:
    """The kind ``train.executor`` names."""
    return EXECUTORS.get(train.executor)
