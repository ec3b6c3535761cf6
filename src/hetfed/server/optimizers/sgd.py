"""sgd: x ← x + η·Δ (η = 1: FedAvg, the combined model itself, bit for bit)."""

from __future__ import annotations

from dataclasses import dataclass

from hetfed.server.optimizers import ServerOptimizer, State, Weights, register


@register
@dataclass(frozen=True)
class SGD(ServerOptimizer):
    name = "sgd"

    def update(self, params: Weights, combined: Weights, state: State) -> tuple[Weights, State]:
        if self.lr == 1.0:
            return {k: combined[k] for k in params}, state
        return {k: v + self.lr * (combined[k] - v) for k, v in params.items()}, state
