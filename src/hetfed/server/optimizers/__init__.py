"""Server optimisers on the pseudo-gradient Δ = (combined client models) − (global model).

Like optax's gradient transformations: a value with ``init(params) -> state`` and
``update(params, delta, state) -> (new params, new state)``; the state is a plain
dict of tensors (and a step count) that lives in the server state, so it is
checkpointed with it and a resumed run continues bit for bit.

- ``sgd``: x ← x + η·Δ (η = 1: FedAvg; ``server.optimizer.lr`` is the old ``train.server_lr`` and ``server.lr``).
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

``variant: flower`` is Flower's own strategies (``flwr.serverapp.strategy``, 1.42), which
differ from the papers: FedAdagrad, FedAdam and FedYogi start v at 0 (not τ²), and FedAdam alone
scales η by √(1 − β₂^(t+1))/(1 − β₁^(t+1)) at round t = 1, 2, … (its round counted from 1 and the
exponent one ahead: 0.742·η at round 1 for β = 0.9 / 0.99); FedYogi and FedAdagrad never rescale η,
and FedAdagrad has no first moment (β₁ = 0: m is the round's Δ, whatever ``beta1`` says).
Flower's FedAvgM is Hsu et al.'s (its first momentum is the first Δ, as here). ``t`` here is the
optimiser's step count: Flower's round number when no round is skipped.

``bias_correction: true`` is Kingma & Ba's correction instead: v₋₁ = 0 and η scaled by
√(1 − β₂ᵗ)/(1 − β₁ᵗ) at step t = 1, 2, … (FedAdagrad: by 1/(1 − β₁ᵗ) only) — not Flower's.

Each optimiser is one file in this package registering a subclass of :class:`ServerOptimizer` under its
``server.optimizer.kind`` name, with its own parameters (``Params``: the keys beside the kind, e.g.
``server.optimizer: {kind: adam, lr: 0.01, beta2: 0.999}``); :func:`optimizer_for` builds the configured one.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field

from hetfed.config import ServerConfig
from hetfed.registry import ComponentParams, Registry, describe_params

Weights = dict[str, torch.Tensor]
#: an optimiser's state between rounds (step count, moments): plain data, checkpointed with the server
State = dict[str, Any]


@dataclass(frozen=True)
class ServerOptimizer:
    """An optimiser on the pseudo-gradient Δ = combined − params, built with η and the parameters its ``Params``
    declares (the other fields keep their defaults, unread).

    ``init(params)`` is its state before round 1 ({} when it keeps none); ``update(params, combined,
    state)`` the new global model and state."""

    name: ClassVar[str] = ""
    #: η when ``server.optimizer.lr`` is not set
    default_lr: ClassVar[float] = 1.0
    #: its own keys beside ``server.optimizer.kind`` (none: sgd)
    Params: ClassVar[type[ComponentParams]] = ComponentParams
    lr: float = 1.0
    momentum: float = 0.9
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3
    bias_correction: bool = False
    variant: str = "paper"

    def init(self, params: Weights) -> State:
        return {}

    def update(self, params: Weights, combined: Weights, state: State) -> tuple[Weights, State]:
        raise NotImplementedError


class VariantParams(ComponentParams):
    variant: Literal["paper", "flower"] = Field(
        "paper", description="paper: the paper's algorithm (Reddi et al.'s Algorithm 2, Hsu et al.'s FedAvgM); "
        "flower: Flower's own strategy class (flwr.serverapp.strategy) — the module docstring says how they differ")


def _described(cls: type[ServerOptimizer]) -> dict[str, Any]:
    """An optimiser as plain data (``hetfed components optimizer``): its η default and its own parameters."""
    doc = (importlib.import_module(cls.__module__).__doc__ or "").strip()
    return {"summary": " ".join(doc.split("\n\n")[0].split()), "default_lr": cls.default_lr,
            "params": describe_params(cls.Params)}


KINDS: Registry[type[ServerOptimizer]] = Registry("optimizer", __name__, "server.optimizer.kind", describe=_described)


def register(cls: type[ServerOptimizer]) -> type[ServerOptimizer]:
    return KINDS.register(cls.name, cls)


def names() -> list[str]:
    return KINDS.names()


def optimizer_for(server: ServerConfig) -> ServerOptimizer:
    """The optimiser ``server.optimizer.kind`` names, with η and its own parameters."""
    chosen = server.optimizer
    return KINDS.get(chosen.kind)(lr=chosen.effective_lr, **dict(chosen.params))
