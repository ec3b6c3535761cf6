"""``vectorised`` (default): every chosen client's parameters stacked and trained together, in chunks that fit
``train.memory_budget_mb`` (or ``train.chunk_clients``) — :class:`~hetfed.executors.inprocess.VectorisedExecutor`."""

from __future__ import annotations

from hetfed.config import TrainConfig
from hetfed.executors.inprocess import Executor, VectorisedExecutor
from hetfed.executors.kinds import ExecutorKind, register


@register
class Vectorised(ExecutorKind):
    name = "vectorised"
    summary = "in this process: the clients' parameters stacked and trained together, chunked to a memory budget"
    stackable = True

    def client_steps(self, train: TrainConfig) -> Executor:
        return VectorisedExecutor(train.memory_budget_mb, train.chunk_clients)
