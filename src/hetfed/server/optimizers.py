"""Server optimisers on the pseudo-gradient Δ = (combined client models) − (global model).

Like optax's gradient transformations: a value with ``init(params) -> state`` and
``update(params, delta, state) -> (new params, new state)``; the state is a plain
dict of tensors (and a step count) that lives in the server state, so it is
checkpointed with it and a resumed run continues bit for bit.

- ``sgd``: x ← x + η·Δ (η = 1: FedAvg; ``server.lr`` is the old ``train.server_lr``).
- ``avgm``: FedAvgM (Hsu, Qi, Brown 2019, "Measuring the effects of non-identical data
  distribution", §3): v ← β·v + Δ; x ← x + η·v.
- ``adagrad``, ``adam``, ``yogi``: Reddi et al. 2021, "Adaptive Federated Optimization",
  Algorithm 2, with m₋₁ = 0 and v₋₁ = τ² (the paper asks v₋₁ ≥ τ²):

      m ← β₁·m + (1 − β₁)·Δ
      adagrad: v ← v + Δ²
      adam:    v ← β₂·v + (1 − β₂)·Δ²
      yogi:    v ← v − (1 − β₂)·Δ²·sign(v − Δ²)
      x ← x + η·m / (√v + τ)

  The paper's algorithm has no bias correction.

``server.variant: flower`` is Flower's own strategies (``flwr.serverapp.strategy``, 1.42), which
differ from the papers: FedAdagrad, FedAdam and FedYogi start v at 0 (not τ²), and FedAdam alone
scales η by √(1 − β₂^(t+1))/(1 − β₁^(t+1)) at round t = 1, 2, … (its round counted from 1 and the
exponent one ahead: 0.742·η at round 1 for β = 0.9 / 0.99); FedYogi and FedAdagrad never rescale η,
and FedAdagrad has no first moment (β₁ = 0: m is the round's Δ, whatever ``server.beta1`` says).
Flower's FedAvgM is Hsu et al.'s (its first momentum is the first Δ, as here). ``t`` here is the
optimiser's step count: Flower's round number when no round is skipped.

``server.bias_correction: true`` is Kingma & Ba's correction instead: v₋₁ = 0 and η scaled by
√(1 − β₂ᵗ)/(1 − β₁ᵗ) at step t = 1, 2, … (FedAdagrad: by 1/(1 − β₁ᵗ) only) — not Flower's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Params = dict[str, torch.Tensor]
KINDS = ("sgd", "avgm", "adagrad", "adam", "yogi")


@dataclass(frozen=True)
class ServerOptimizer:
    """One of :data:`KINDS` with its hyper-parameters (``server.*``)."""

    kind: str = "sgd"
    lr: float = 1.0
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3
    bias_correction: bool = False
    variant: str = "paper"

    @classmethod
    def from_config(cls, server) -> ServerOptimizer:
        return cls(server.optimizer, server.effective_lr, server.momentum, server.beta1, server.beta2, server.tau,
                   server.bias_correction, server.variant)

    def init(self, params: Params) -> dict:
        """The optimiser's state before round 1 ({} for plain SGD)."""
        if self.kind == "sgd":
            return {}
        if self.kind == "avgm":
            return {"t": 0, "v": {k: torch.zeros_like(p) for k, p in params.items()}}
        v0 = 0.0 if self.bias_correction or self.variant == "flower" else self.tau**2
        return {"t": 0, "m": {k: torch.zeros_like(p) for k, p in params.items()},
                "v": {k: torch.full_like(p, v0) for k, p in params.items()}}

    def update(self, params: Params, combined: Params, state: dict) -> tuple[Params, dict]:
        """The new global model and optimiser state from the round's ``combined`` model.

        The pseudo-gradient is Δ = combined − params.
        """
        if self.kind == "sgd":
            if self.lr == 1.0:  # FedAvg: the combined model itself, bit for bit
                return {k: combined[k] for k in params}, state
            return {k: v + self.lr * (combined[k] - v) for k, v in params.items()}, state
        delta = {k: combined[k] - v for k, v in params.items()}
        if not state:
            state = self.init(params)
        t = int(state["t"]) + 1
        if self.kind == "avgm":
            v = {k: self.momentum * state["v"][k] + delta[k] for k in params}
            return {k: params[k] + self.lr * v[k] for k in params}, {"t": t, "v": v}
        # flwr's FedAdagrad has no β₁ (it passes 0 to FedOpt): its m is the round's Δ
        b1 = 0.0 if self.variant == "flower" and self.kind == "adagrad" else self.beta1
        b2 = self.beta2
        m = {k: b1 * state["m"][k] + (1 - b1) * delta[k] for k in params}
        v = {}
        for k in params:
            d2 = delta[k] * delta[k]
            if self.kind == "adagrad":
                v[k] = state["v"][k] + d2
            elif self.kind == "adam":
                v[k] = b2 * state["v"][k] + (1 - b2) * d2
            else:  # yogi
                v[k] = state["v"][k] - (1 - b2) * d2 * torch.sign(state["v"][k] - d2)
        lr = self.lr
        if self.bias_correction:
            lr = lr / (1 - b1**t) * ((1 - b2**t) ** 0.5 if self.kind != "adagrad" else 1.0)
        elif self.variant == "flower" and self.kind == "adam":  # flwr's FedAdam: exponent round + 1
            lr = lr * (1 - b2 ** (t + 1)) ** 0.5 / (1 - b1 ** (t + 1))
        new = {k: params[k] + lr * m[k] / (v[k].sqrt() + self.tau) for k in params}
        return new, {"t": t, "m": m, "v": v}
