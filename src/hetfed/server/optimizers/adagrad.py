"""adagrad: FedAdagrad, v ← v + Δ². Flower's FedAdagrad has no first moment (β₁ = 0)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from hetfed.registry import ComponentParams
from hetfed.server.optimizers import register
from hetfed.server.optimizers.adaptive import Adaptive, AdaptiveParams


@register
@dataclass(frozen=True)
class Adagrad(Adaptive):
    name = "adagrad"
    Params: ClassVar[type[ComponentParams]] = AdaptiveParams  # no β₂: v ← v + Δ²
    flower_without_beta1: bool = True

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        return v + d2
