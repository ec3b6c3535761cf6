"""What the asynchronous algorithms share (FedBuff, FedAsync): clients train FedAvg's local update from whatever
model version they were sent, and the server merges their arrivals — weighted by how stale they are — through
the method's server chain (:mod:`hetfed.server.chain`), so robust rules and server optimisers serve them too
(DP-FedAvg does not: its accountant assumes synchronous rounds of sampled clients, so it is refused).

The event loop that sends, times and collects them is :mod:`hetfed.executors.asynchronous`: it keeps
``concurrency`` clients training at once on the simulated clock (:mod:`hetfed.engine.clock`) and calls
:meth:`Asynchronous.merge` every ``buffer`` arrivals. A server *update* is what a synchronous run calls a round
(``train.rounds`` of them; ``eval_every`` counts them).

Staleness τ of an arrival: the server updates made since the model it trained from. The staleness functions are
FedAsync's (Xie et al. 2019, §5.2): constant s(τ) = 1; polynomial s(τ) = (τ + 1)^−a; hinge s(τ) = 1 for τ ≤ b,
else 1 / (a(τ − b) + 1). FedBuff's 1/√(1 + τ) (Nguyen et al. 2022, §5) is the polynomial with a = ½.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field

from hetfed.algorithms.build import METHOD_KEY
from hetfed.algorithms.fedavg import FedAvg
from hetfed.algorithms.registry import AlgorithmParams
from hetfed.engine.types import Params, ServerState, Upload
from hetfed.errors import ConfigError


class AsyncParams(AlgorithmParams):
    concurrency: int = Field(10, ge=1, description="M: clients training at once (each arrival starts another)")
    staleness: Literal["constant", "polynomial", "hinge"] = Field(
        "polynomial", description="s(τ): constant 1, polynomial (τ + 1)^−poly_a, or hinge (1 for τ ≤ hinge_b, else "
        "1/(hinge_a(τ − hinge_b) + 1))")
    poly_a: float = Field(0.5, gt=0, description="polynomial exponent a (FedBuff's 1/√(1+τ): 0.5)")
    hinge_a: float = Field(10.0, gt=0, description="hinge slope a (FedAsync's experiments: 10)")
    hinge_b: float = Field(4.0, ge=0, description="hinge knee b (FedAsync's experiments: 4)")


def staleness_weight(tau: np.ndarray, p: AsyncParams) -> np.ndarray:
    """s(τ) for every arrival's staleness τ (FedAsync §5.2)."""
    tau = np.asarray(tau, dtype=np.float64)
    if p.staleness == "constant":
        return np.ones_like(tau)
    if p.staleness == "polynomial":
        return (tau + 1.0) ** (-p.poly_a)
    return np.where(tau <= p.hinge_b, 1.0, 1.0 / (p.hinge_a * (tau - p.hinge_b) + 1.0))


class Asynchronous(FedAvg):
    """FedAvg's clients under an asynchronous server; subclasses say how arrivals are merged."""

    params: AsyncParams

    @property
    def buffer(self) -> int:
        """K: arrivals per server update."""
        return 1

    def bind(self, fed, seed: int = 0, per_round: int = 1) -> None:
        """Refuse, before any training, what an asynchronous server cannot honour: more clients at once than there
        are, and the synchronous round's settings (sampling, dropout, deadline), which it would ignore."""
        super().bind(fed, seed, per_round)
        eligible = int((~np.asarray(fed.opted_out, dtype=bool)).sum())
        if self.params.concurrency > eligible:
            raise ConfigError(f"{METHOD_KEY}params.concurrency = {self.params.concurrency} is not allowed: the "
                              f"federation has {eligible} clients that take part; expected at most {eligible}")
        chain = self.context.pipeline
        if chain is not None and chain.min_clients > self.buffer:
            raise ConfigError(f"server.min_clients = {chain.min_clients} is not allowed with {METHOD_KEY}algorithm = "
                              f"{self.spec.name!r}: every merge takes {self.buffer} arrivals (params.buffer); "
                              f"expected server.min_clients ≤ {self.buffer}")
        t = self.train
        synchronous = {"train.client_fraction": (t.client_fraction, 1.0), "train.clients_per_round":
                       (t.clients_per_round, None), "train.client_dropout": (t.client_dropout, 0.0),
                       "train.clock.deadline": (t.clock.deadline, None), "train.stragglers.deadline":
                       (t.stragglers.deadline, None)}
        for key, (value, plain) in synchronous.items():
            if value != plain:
                raise ConfigError(f"{key} = {value!r} is not allowed with {METHOD_KEY}algorithm = "
                                  f"{self.spec.name!r}: an asynchronous server has no rounds to sample, drop or "
                                  f"time out; expected {plain!r} (params.concurrency sets how many clients train "
                                  "at once)")

    def merge(self, state: ServerState, arrivals: Upload, starts: Params, staleness: np.ndarray) -> ServerState:
        """The server's next model from ``arrivals`` (one row per client, in arrival order), the models they trained
        from (``starts``, stacked the same way) and their staleness."""
        raise NotImplementedError


def weights(staleness: np.ndarray, p: AsyncParams, like: torch.Tensor) -> torch.Tensor:
    """s(τ) as a column to scale stacked rows by."""
    w = torch.as_tensor(staleness_weight(staleness, p), dtype=like.dtype, device=like.device)
    return w.reshape(-1, *([1] * (like.dim() - 1)))
