"""FedMoE's personal model: ``ŷ = h(x)·f_s(x) + (1 − h(x))·f_g(x)``.

``f_g`` is the (frozen) FedAvg global model, ``f_s`` the client's specialist and
``h`` a gate with the model's architecture and one sigmoid output (Listo Zec,
Mogren et al.). Every parameter is *local*: the client keeps its copy of the
global model, its specialist and its gate. The global expert runs in evaluation
mode (no dropout).

``blend = "prob"`` mixes class probabilities, as the paper's equation says; the
forward returns ``log ŷ`` so that cross-entropy on it is the mixture's negative
log-likelihood. ``blend = "log"`` mixes the experts' logits instead, as the
authors' code does.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from hetfed.models.base import Model, Noise, Params, ParamSpec, under

EXPERTS = ("global", "specialist")


class Mixture(Model):
    def __init__(self, build: Callable[[int], Model], n_classes: int, blend: str = "prob"):
        if blend not in ("prob", "log"):
            raise ValueError(f"blend = {blend!r}: expected 'prob' or 'log'")
        self.expert = build(n_classes)
        self.gate = build(1)
        self.n_classes = n_classes
        self.blend = blend
        self._specs = [
            ParamSpec(f"{prefix}.{s.name}", s.shape, s.init, local=True)
            for prefix, model in (("global", self.expert), ("specialist", self.expert), ("gate", self.gate))
            for s in model.specs()
        ]

    def specs(self) -> list[ParamSpec]:
        return self._specs

    @property
    def reads_rows(self) -> bool:  # type: ignore[override]
        return self.expert.reads_rows or self.gate.reads_rows

    def stacks_clients(self, device: str) -> bool:
        return self.expert.stacks_clients(device) and self.gate.stacks_clients(device)

    def gate_value(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        """h(x) ∈ [0, 1], shape [n, batch, 1]."""
        return torch.sigmoid(self.gate.forward(under(params, "gate."), x, noise))

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        f_g = self.expert.forward(under(params, "global."), x, None)  # frozen, eval mode
        f_s = self.expert.forward(under(params, "specialist."), x, noise)
        z = self.gate.forward(under(params, "gate."), x, noise)  # the gate's logit; h = σ(z)
        if self.blend == "log":
            h = torch.sigmoid(z)
            return h * f_s + (1 - h) * f_g
        # log(h·p_s + (1 − h)·p_g) in log space: exact for classes far below float32's
        # resolution, where summing probabilities and clamping would lose the loss and its gradient
        terms = torch.stack([F.logsigmoid(z) + F.log_softmax(f_s, -1), F.logsigmoid(-z) + F.log_softmax(f_g, -1)])
        return torch.logsumexp(terms, 0)

    def activation_floats(self, batch: int) -> int:
        return 3 * self.expert.activation_floats(batch)

    def n_params(self) -> int:
        return 2 * self.expert.n_params() + self.gate.n_params()
