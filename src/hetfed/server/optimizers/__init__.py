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

Each optimiser is one file in this package registering a subclass of :class:`ServerOptimizer`
under its ``server.optimizer`` name; :func:`optimizer_for` builds the configured one.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from hetfed.config import ServerConfig
from hetfed.registry import Registry

Params = dict[str, torch.Tensor]
#: an optimiser's state between rounds (step count, moments): plain data, checkpointed with the server
State = dict[str, Any]


@dataclass(frozen=True)
class ServerOptimizer:
    """An optimiser on the pseudo-gradient Δ = combined − params, with ``server.*``'s hyper-parameters.

    ``init(params)`` is its state before round 1 ({} when it keeps none); ``update(params, combined,
    state)`` the new global model and state."""

    name: ClassVar[str] = ""
    #: η when ``server.lr`` is not set
    default_lr: ClassVar[float] = 1.0
    lr: float = 1.0
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3
    bias_correction: bool = False
    variant: str = "paper"

    def init(self, params: Params) -> State:
        return {}

    def update(self, params: Params, combined: Params, state: State) -> tuple[Params, State]:
        raise NotImplementedError


def _described(cls: type[ServerOptimizer]) -> dict[str, Any]:
    """An optimiser as plain data (``hetfed components optimizer``): its parameters are the ``server.*`` keys
    (lr, momentum, beta1, beta2, tau, bias_correction, variant)."""
    doc = (importlib.import_module(cls.__module__).__doc__ or "").strip()
    return {"summary": " ".join(doc.split("\n\n")[0].split()), "default_lr": cls.default_lr}


KINDS: Registry[type[ServerOptimizer]] = Registry("optimizer", __name__, "server.optimizer", describe=_described)


def register(cls: type[ServerOptimizer]) -> type[ServerOptimizer]:
    return KINDS.register(cls.name, cls)


def names() -> list[str]:
    return KINDS.names()


def optimizer_for(server: ServerConfig) -> ServerOptimizer:
    """The optimiser ``server.optimizer`` names, with ``server.*``'s hyper-parameters."""
    return KINDS.get(server.optimizer)(server.effective_lr, server.momentum, server.beta1, server.beta2, server.tau,
                                       server.bias_correction, server.variant)
