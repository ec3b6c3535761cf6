"""avgm: FedAvgM (Hsu, Qi, Brown 2019, §3): v ← β·v + Δ; x ← x + η·v. Flower's FedAvgM is the same."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from pydantic import Field

from hetfed.registry import ComponentParams
from hetfed.server.optimizers import ServerOptimizer, State, VariantParams, Weights, register


class AvgMParams(VariantParams):
    momentum: float = Field(0.9, ge=0, lt=1, description="the server momentum β")


@register
@dataclass(frozen=True)
class AvgM(ServerOptimizer):
    name = "avgm"
    Params: ClassVar[type[ComponentParams]] = AvgMParams

    def init(self, params: Weights) -> State:
        return {"t": 0, "v": {k: torch.zeros_like(p) for k, p in params.items()}}

    def update(self, params: Weights, combined: Weights, state: State) -> tuple[Weights, State]:
        state = state or self.init(params)
        delta = {k: combined[k] - v for k, v in params.items()}
        v = {k: self.momentum * state["v"][k] + delta[k] for k in params}
        return {k: params[k] + self.lr * v[k] for k in params}, {"t": int(state["t"]) + 1, "v": v}
