"""Executors run ``local_update`` for the sampled clients. One algorithm, many ways.

- :class:`SequentialExecutor`: a plain per-client loop (stacks of one) — the
  reference the vectorised executor is tested against.
- :class:`VectorisedExecutor` (default): the sampled clients' parameters stacked
  along a leading axis and trained together, in chunks that fit a memory budget.

Both call the algorithm's pure ``local_update`` with the same per-client seeds,
so they agree to float tolerance. A Flower executor (deployment) plugs in at the
same seam: it receives the broadcast and the client ids and returns an Upload.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from hetfed.algorithms.base import Algorithm
from hetfed.engine.rng import CLIENT_ROUND, derive_seed
from hetfed.engine.types import (
    Broadcast,
    ClientData,
    ClientState,
    Upload,
    concat_uploads,
    stack_states,
    unstack_state,
)


@dataclass(frozen=True, eq=False)
class Pool:
    """The federation's train pool on the training device, and each client's indices."""

    x: torch.Tensor
    y: torch.Tensor
    train: tuple[np.ndarray, ...]
    seed: int


class Executor(Protocol):
    def run(self, algo: Algorithm, bc: Broadcast, clients: list[int], states: dict[int, ClientState], pool: Pool) -> tuple[Upload, dict[int, ClientState]]: ...


def _run_stack(algo: Algorithm, bc: Broadcast, chunk: list[int], states: dict[int, ClientState], pool: Pool):
    data = ClientData(
        client_ids=chunk,
        x=pool.x,
        y=pool.y,
        indices=[pool.train[k] for k in chunk],
        seeds=[derive_seed(pool.seed, CLIENT_ROUND, bc.round, k) for k in chunk],
    )
    upload, new = algo.local_update(bc, stack_states([states[k] for k in chunk]), data)
    return upload, dict(zip(chunk, unstack_state(new, len(chunk)), strict=True)) if new else {k: {} for k in chunk}


class SequentialExecutor:
    """One client at a time."""

    name = "sequential"

    def run(self, algo, bc, clients, states, pool):
        uploads, new_states = [], {}
        for k in clients:
            upload, new = _run_stack(algo, bc, [k], states, pool)
            uploads.append(upload)
            new_states.update(new)
        return concat_uploads(uploads), new_states


class VectorisedExecutor:
    """All sampled clients at once, chunked to ``memory_budget_mb`` (or ``chunk_clients``)."""

    name = "vectorised"

    def __init__(self, memory_budget_mb: float = 128, chunk_clients: int | None = None):
        self.memory_budget_mb = memory_budget_mb
        self.chunk_clients = chunk_clients

    def chunk_size(self, algo: Algorithm) -> int:
        if self.chunk_clients is not None:
            return self.chunk_clients
        model = algo.model
        # params + grads + up to two optimiser buffers + a server copy, plus activations
        floats = 5 * model.n_params() + model.activation_floats(algo.schedule.batch_size)
        return max(1, int(self.memory_budget_mb * 2**20 / (4 * floats)))

    def run(self, algo, bc, clients, states, pool):
        size = self.chunk_size(algo)
        uploads, new_states = [], {}
        for start in range(0, len(clients), size):
            upload, new = _run_stack(algo, bc, clients[start : start + size], states, pool)
            uploads.append(upload)
            new_states.update(new)
        return concat_uploads(uploads), new_states


def build_executor(kind: str, memory_budget_mb: float = 128, chunk_clients: int | None = None) -> Executor:
    if kind == "sequential":
        return SequentialExecutor()
    return VectorisedExecutor(memory_budget_mb, chunk_clients)


def n_chunks(n: int, size: int) -> int:
    return math.ceil(n / max(size, 1))
