"""sgd: x ← x + η·Δ (η = 1: FedAvg, the combined model itself, bit for bit)."""

from __future__ import annotations

from dataclasses import dataclass

from hetfed.server.optimizers import Params, ServerOptimizer, State, register


@register
@dataclass(frozen=True)
class SGD(ServerOptimizer):
    name = "sgd"

    def update(self, params: Params, combined: Params, state: State) -> tuple[Params, State]:
        if self.lr == 1.0:
            return {k: combined[k] for k in params}, state
        return {k: v + self.lr * (combined[k] - v) for k, v in params.items()}, state
