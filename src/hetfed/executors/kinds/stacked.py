"""``stacked``: the runs of a sweep trained as one stack of clients (``hetfed sweep … --stack``): each run on a
thread of its own, its rounds' client steps computed together with the other runs' —
:class:`~hetfed.executors.stacked_runs.StackedRunExecutor`. Handed to each run by the sweep, never named by a
config."""

from __future__ import annotations

from collections.abc import Callable

from hetfed.config import TrainConfig
from hetfed.errors import RunError
from hetfed.executors.inprocess import Executor
from hetfed.executors.kinds import ExecutorKind, register
from hetfed.executors.stacked_runs import Rendezvous, StackedRunExecutor


@register
class Stacked(ExecutorKind):
    name = "stacked"
    summary = ("a sweep's runs in threads of one process, each round's client steps of every run computed as one "
               "stack (hetfed sweep --stack)")
    selectable = False
    stacks_runs = True
    rendezvous: Rendezvous | None = None

    def for_runs(self, members: int, on_round: Callable[[int, int], object] | None = None,
                 on_ready: Callable[[int, int], object] | None = None) -> Stacked:
        """This kind bound to a new meeting point of ``members`` runs (each hands it to its run, then leaves)."""
        bound = Stacked()
        bound.rendezvous = Rendezvous(members, on_round, on_ready)
        return bound

    def join(self) -> None:
        if self.rendezvous is not None:
            self.rendezvous.join()

    def leave(self) -> None:
        if self.rendezvous is not None:
            self.rendezvous.leave()

    def serve(self) -> None:
        if self.rendezvous is not None:
            self.rendezvous.serve()

    def client_steps(self, train: TrainConfig) -> Executor:
        if self.rendezvous is None:
            raise RunError("executor 'stacked' is handed to the runs of a stacked sweep (hetfed sweep --stack); "
                           "expected train.executor 'vectorised', 'sequential' or 'flower'")
        return StackedRunExecutor(self.rendezvous, train.memory_budget_mb, train.chunk_clients)
