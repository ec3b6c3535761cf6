"""``sequential``: one client at a time — the reference the vectorised executor is tested against
(:class:`~hetfed.executors.inprocess.SequentialExecutor`)."""

from __future__ import annotations

from hetfed.config import TrainConfig
from hetfed.executors.inprocess import Executor, SequentialExecutor
from hetfed.executors.kinds import ExecutorKind, register


@register
class Sequential(ExecutorKind):
    name = "sequential"
    summary = "in this process, one client at a time: the reference the vectorised executor is tested against"
    unread_train = {"chunk_clients": "executor 'sequential' trains one client at a time"}

    def client_steps(self, train: TrainConfig) -> Executor:
        return SequentialExecutor(train.memory_budget_mb)
