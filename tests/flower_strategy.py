"""What driving one of Flower's own strategy classes outside a running ServerApp needs (the tests that check hetfed's
server steps against Flower's: the server optimisers', q-FedAvg's): a task identity for its Messages, and the part of
a Grid its ``configure_train`` asks."""

from __future__ import annotations

import pytest


@pytest.fixture
def flower_task():
    """Flower's Messages need a task identity (set by a running ServerApp); set one for the test."""
    pytest.importorskip("flwr")
    from flwr.supercore.task_identity import TaskIdentity

    saved = (TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, 1, 0
    yield
    TaskIdentity._task_id, TaskIdentity._run_id, TaskIdentity._node_id = saved


class Nodes:
    """The part of a Flower Grid a strategy's configure_train asks: which nodes are connected."""

    def __init__(self, n: int):
        self.n = n

    def get_node_ids(self):
        return list(range(1, self.n + 1))
