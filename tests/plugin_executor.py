"""A user's plugin module, as ``plugins: [tests.plugin_executor]`` names it: one executor in one file.

``plugin_counting`` runs the clients in this process like ``vectorised`` and records what its session did: that
it was opened and closed around the run, and how many client updates it computed — what an executor that
starts something (a pool, a cluster) would do on entry and exit."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from hetfed.config import TrainConfig
from hetfed.executors.inprocess import Executor, VectorisedExecutor
from hetfed.executors.kinds import ExecutorKind, InProcessSession, Opening, Session, register

#: what the sessions did, in order: ("open", n_clients), ("train", n_clients_in_round), ("close", None)
EVENTS: list[tuple[str, int | None]] = []


class Counting(VectorisedExecutor):
    def train(self, bc, clients, reduce=False):
        EVENTS.append(("train", len(clients)))
        return super().train(bc, clients, reduce)


@register
class CountingKind(ExecutorKind):
    name = "plugin_counting"
    summary = "vectorised, counting the client updates it computes (a test plugin)"

    def client_steps(self, train: TrainConfig) -> Executor:
        return Counting(train.memory_budget_mb, train.chunk_clients)

    @contextmanager
    def open(self, opening: Opening) -> Iterator[Session]:
        EVENTS.append(("open", opening.n_clients))
        try:
            yield InProcessSession(self, opening.config)
        finally:
            EVENTS.append(("close", None))


class _Unwatched:
    """A client-step executor written without ``watch``/``watched`` (what an attack on a client's update reads): the
    vectorised executor's every other method."""

    def __init__(self, inner: Executor):
        self._inner = inner

    def __getattr__(self, name: str):
        if name in ("watch", "watched"):
            raise AttributeError(name)
        return getattr(self._inner, name)


@register
class UnwatchedKind(ExecutorKind):
    name = "plugin_unwatched"
    summary = "vectorised, without watch and watched (a test plugin)"

    def client_steps(self, train: TrainConfig) -> Executor:
        return _Unwatched(VectorisedExecutor(train.memory_budget_mb, train.chunk_clients))  # type: ignore[return-value]
