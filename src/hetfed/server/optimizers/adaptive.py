"""What FedAdagrad, FedAdam and FedYogi share (Reddi et al. 2021, Algorithm 2): the first moment, the step
x ← x + η·m/(√v + τ), the starting v and the corrections; each names only its second-moment update."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from pydantic import Field, model_validator

from hetfed.registry import ComponentParams
from hetfed.server.optimizers import ServerOptimizer, State, VariantParams, Weights


class AdaptiveParams(VariantParams):
    """What the three adaptive optimisers take (FedAdam and FedYogi also ``beta2``)."""

    beta1: float = Field(0.9, ge=0, lt=1, description="the first moment's decay β₁")
    tau: float = Field(1e-3, gt=0, description="τ, the adaptivity (and v₋₁ = τ²)")
    bias_correction: bool = Field(
        False, description="Kingma & Ba's bias correction η·√(1−β₂ᵗ)/(1−β₁ᵗ) at step t = 1, 2, … and v₋₁ = 0 (the "
        "paper has neither; Flower's is variant 'flower')")

    @model_validator(mode="after")
    def _one_correction(self) -> AdaptiveParams:
        if self.variant == "flower" and self.bias_correction:
            raise ValueError("server.optimizer.bias_correction = true is not allowed with server.optimizer.variant = "
                             "'flower': Flower's strategies have their own correction; expected one of the two")
        return self


class SecondMomentParams(AdaptiveParams):
    beta2: float = Field(0.99, ge=0, lt=1, description="the second moment's decay β₂")


@dataclass(frozen=True)
class Adaptive(ServerOptimizer):
    default_lr: ClassVar[float] = 0.01
    Params: ClassVar[type[ComponentParams]] = SecondMomentParams
    #: Flower's class of this kind keeps no first moment (its β₁ is 0)
    flower_without_beta1: bool = False

    def init(self, params: Weights) -> State:
        v0 = 0.0 if self.bias_correction or self.variant == "flower" else self.tau**2
        return {"t": 0, "m": {k: torch.zeros_like(p) for k, p in params.items()},
                "v": {k: torch.full_like(p, v0) for k, p in params.items()}}

    def second_moment(self, v: torch.Tensor, d2: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def step_size(self, t: int, b1: float) -> float:
        """η at step t (Kingma & Ba's correction, or Flower's FedAdam's, where they apply)."""
        return self.lr / (1 - b1**t) if self.bias_correction else self.lr

    def update(self, params: Weights, combined: Weights, state: State) -> tuple[Weights, State]:
        delta = {k: combined[k] - v for k, v in params.items()}
        state = state or self.init(params)
        t = int(state["t"]) + 1
        b1 = 0.0 if self.variant == "flower" and self.flower_without_beta1 else self.beta1
        m = {k: b1 * state["m"][k] + (1 - b1) * delta[k] for k in params}
        v = {k: self.second_moment(state["v"][k], delta[k] * delta[k]) for k in params}
        lr = self.step_size(t, b1)
        new = {k: params[k] + lr * m[k] / (v[k].sqrt() + self.tau) for k in params}
        return new, {"t": t, "m": m, "v": v}
