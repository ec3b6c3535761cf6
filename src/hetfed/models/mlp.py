"""Dense models over a client axis: MLP (ReLU, dropout) and logistic regression."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from hetfed.models.base import Model, Noise, Params, ParamSpec, dense, dropout, fan_in_init


def _linear_specs(prefix: str, fan_in: int, fan_out: int, local: bool = False) -> list[ParamSpec]:
    init = fan_in_init(fan_in)
    return [
        ParamSpec(f"{prefix}.weight", (fan_in, fan_out), init, local),
        ParamSpec(f"{prefix}.bias", (fan_out,), init, local),
    ]


class MLP(Model):
    """``in → hidden… → classes``, ReLU, dropout after every hidden layer."""

    def __init__(self, in_features: int, hidden: Sequence[int], n_classes: int, dropout: float = 0.0):
        self.in_features = in_features
        self.hidden = list(hidden)
        self.n_classes = n_classes
        self.p = dropout
        widths = [in_features, *self.hidden, n_classes]
        self._specs = [
            spec for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=True))
            for spec in _linear_specs(f"layers.{i}", a, b)
        ]

    def specs(self) -> list[ParamSpec]:
        return self._specs

    @property
    def head_names(self) -> tuple[str, ...]:
        last = len(self.hidden)
        return (f"layers.{last}.weight", f"layers.{last}.bias")

    @property
    def latent_dim(self) -> int:
        return self.hidden[-1] if self.hidden else self.in_features

    def features(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        h = x.flatten(2)
        for i in range(len(self.hidden)):
            h = dropout(torch.relu(dense(h, params[f"layers.{i}.weight"], params[f"layers.{i}.bias"])), self.p, noise)
        return h

    def head(self, params: Params, z: torch.Tensor) -> torch.Tensor:
        last = len(self.hidden)
        return dense(z, params[f"layers.{last}.weight"], params[f"layers.{last}.bias"])

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        return self.head(params, self.features(params, x, noise))

    def activation_floats(self, batch: int) -> int:
        return 3 * batch * (self.in_features + sum(self.hidden) + self.n_classes)


class LogisticRegression(MLP):
    """A single linear layer with softmax (an MLP without hidden layers)."""

    def __init__(self, in_features: int, n_classes: int):
        super().__init__(in_features, [], n_classes, 0.0)


def flat_size(shape: Sequence[int]) -> int:
    return int(math.prod(shape))
