"""adam: FedAdam, v ← β₂·v + (1 − β₂)·Δ². Kingma & Ba's correction √(1 − β₂ᵗ)/(1 − β₁ᵗ) with
``bias_correction``; Flower's FedAdam scales η by √(1 − β₂^(t+1))/(1 − β₁^(t+1)) instead."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hetfed.server.optimizers import register
from hetfed.server.optimizers.adaptive import Adaptive


@register
@dataclass(frozen=True)
class Adam(Adaptive):
    name = "adam"

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        return self.beta2 * v + (1 - self.beta2) * d2

    def step_size(self, t: int, b1: float) -> float:
        b2 = self.beta2
        if self.bias_correction:
            return float(self.lr / (1 - b1**t) * (1 - b2**t) ** 0.5)
        if self.variant == "flower":  # flwr's FedAdam: exponent round + 1
            return float(self.lr * (1 - b2 ** (t + 1)) ** 0.5 / (1 - b1 ** (t + 1)))
        return self.lr
