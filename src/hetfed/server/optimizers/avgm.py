"""avgm: FedAvgM (Hsu, Qi, Brown 2019, §3): v ← β·v + Δ; x ← x + η·v. Flower's FedAvgM is the same."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hetfed.server.optimizers import Params, ServerOptimizer, State, register


@register
@dataclass(frozen=True)
class AvgM(ServerOptimizer):
    name = "avgm"

    def init(self, params: Params) -> State:
        return {"t": 0, "v": {k: torch.zeros_like(p) for k, p in params.items()}}

    def update(self, params: Params, combined: Params, state: State) -> tuple[Params, State]:
        state = state or self.init(params)
        delta = {k: combined[k] - v for k, v in params.items()}
        v = {k: self.momentum * state["v"][k] + delta[k] for k in params}
        return {k: params[k] + self.lr * v[k] for k in params}, {"t": int(state["t"]) + 1, "v": v}
