"""FedBuff (Nguyen et al. 2022, "Federated Learning with Buffered Asynchronous Aggregation", Algorithm 1).

``concurrency`` M clients train at once; each sends Δᵢ = θᵢ − θ_start(i), the change it made to the model version
it was sent. The server adds each arrival, scaled by its staleness weight s(τᵢ) (1/√(1 + τᵢ) by default, the
paper's §5), to a buffer; after K = ``buffer`` arrivals it takes a step of its server learning rate η_g
(``server.optimizer.lr``) along the buffer's mean: θ ← θ + η_g·(1/K)Σ s(τᵢ)Δᵢ, and the buffer empties.

Here the step is the method's server chain: each arrival becomes the row θ + s(τᵢ)Δᵢ (its change rebased onto the
server's current model), the chain's combine step averages the K rows — uniformly, as Algorithm 1 does, or by
sample counts (``weighting: samples``, FedAvg's weights) — and its optimiser steps by η_g along mean − θ. With
K = M = every client, no latency spread and η_g = 1 every arrival has τ = 0 and FedBuff is FedAvg.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from hetfed.algorithms._async import Asynchronous, AsyncParams, weights
from hetfed.algorithms.registry import AlgorithmSpec, Capabilities, PrivacyRow, register
from hetfed.engine.types import Params, ServerState, Upload
from hetfed.interface import server_step


class FedBuffParams(AsyncParams):
    buffer: int = Field(5, ge=1, description="K: arrivals per server update (≤ concurrency)")
    weighting: Literal["uniform", "samples"] = Field(
        "uniform", description="the buffer's mean: uniform (Algorithm 1) or by sample counts (FedAvg's weights)")

    @model_validator(mode="after")
    def _buffer_fills(self) -> FedBuffParams:
        if self.buffer > self.concurrency:
            raise ValueError(f"buffer = {self.buffer} is not allowed with concurrency = {self.concurrency}: expected "
                             "buffer ≤ concurrency (K arrivals per update from M clients at once)")
        return self


class FedBuff(Asynchronous):
    params: FedBuffParams

    @property
    def buffer(self) -> int:
        return self.params.buffer

    def merge(self, state: ServerState, arrivals: Upload, starts: Params, staleness: np.ndarray) -> ServerState:
        rows = {}
        w = weights(staleness, self.params, arrivals.num_samples)  # [K]: s(τᵢ) per arrival
        for k, current in state.params.items():
            theta = arrivals.params[k]
            start = starts[k].to(theta.device)
            scale = w.to(theta.device, theta.dtype).view(-1, *([1] * (theta.dim() - 1)))
            rows[k] = (theta - start).mul_(scale).add_(current.to(theta.device).unsqueeze(0))
        counts = arrivals.num_samples if self.params.weighting == "samples" else torch.ones_like(arrivals.num_samples)
        params, extra = server_step(self, state, replace(arrivals, params=rows, num_samples=counts))
        return ServerState(params=params, round=state.round + 1, extra=extra)


register(AlgorithmSpec(
    "fedbuff", FedBuff, "asynchronous: M clients train at once; the server steps along the staleness-weighted mean "
    "change of every K arrivals",
    "Nguyen et al. 2022, Federated Learning with Buffered Asynchronous Aggregation", FedBuffParams,
    Capabilities(whole_round=True, asynchronous=True, stacks_runs=True), quick={"concurrency": 3, "buffer": 2},
    privacy=(
        PrivacyRow(
            method="FedBuff",
            config="`algorithm: fedbuff`",
            params="shared model parameters (the server rebases their change)",
            extra="`train_loss`",
            stays="data; optimiser state when kept",
        ),
    ),
    family="global", venue="AISTATS 2022",
))
