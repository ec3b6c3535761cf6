"""yogi: FedYogi, v ← v − (1 − β₂)·Δ²·sign(v − Δ²); with ``bias_correction`` Kingma & Ba's η·√(1 − β₂ᵗ)/(1 − β₁ᵗ)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hetfed.server.optimizers import register
from hetfed.server.optimizers.adaptive import Adaptive


@register
@dataclass(frozen=True)
class Yogi(Adaptive):
    name = "yogi"

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        return v - (1 - self.beta2) * d2 * torch.sign(v - d2)

    def step_size(self, t: int, b1: float) -> float:
        if self.bias_correction:
            return float(self.lr / (1 - b1**t) * (1 - self.beta2**t) ** 0.5)
        return self.lr
