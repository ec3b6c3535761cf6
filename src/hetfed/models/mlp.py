"""Dense models over a client axis: MLP (ReLU, dropout) and logistic regression."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from hetfed.models import closed_form
from hetfed.models.base import Model, Noise, Params, ParamSpec, dense, dropout, fan_in_init
from hetfed.models.sgd_in_backward import SGDInBackward


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
        #: each layer's (weight, bias) names, input side first (set here, with the specs)
        self._layers = [(f"layers.{i}.weight", f"layers.{i}.bias") for i in range(len(self.hidden) + 1)]

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

    @property
    def compile_gains(self) -> bool:
        """With dropout to fuse, compiling gains (eager / compiled 1.28 at p = 0.5); a step of plain layers, written
        out, is faster eager (0.79–0.90: results/benchmarks_cpu_2026-12-01c)."""
        return self.p > 0

    def closed_form(self, names: set[str]) -> closed_form.ClosedForm | None:
        """This MLP's step written out, training ``names`` (any of its parameters, the others held fixed); a
        subclass or instance that changes the forward has none."""
        return closed_form.for_names(self, MLP, names, self._loss_and_gradients)

    def _loss_and_gradients(self, params: Params, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, noise: Noise,
                            moving: SGDInBackward | None, trained: frozenset[str] | None = None
                            ) -> tuple[torch.Tensor, Params]:
        """:meth:`forward`'s cross-entropy per client and its gradients (``trained``: of those parameters; None: all):
        each layer's input, ReLU output and dropout multipliers kept from the forward, then the layers' backwards
        from the last down to the lowest that trains."""
        h, kept, layers = x.flatten(2), [], self._layers
        for weight, bias in layers[:-1]:
            a = torch.baddbmm(params[bias].unsqueeze(1), h, params[weight]).relu_()
            keep = noise.keep_mask(a.shape[1], a.shape[2], self.p) if self.p > 0 else None
            kept.append((h, a, keep))
            h = a if keep is None else a * keep
        last = len(self.hidden)
        logits = torch.baddbmm(params[layers[last][1]].unsqueeze(1), h, params[layers[last][0]])
        loss, g = closed_form.cross_entropy(logits, y, mask)
        grads: Params = {}
        lowest = closed_form.lowest_trained(layers, trained)
        for i in range(last, lowest - 1, -1):
            h_in = h if i == last else kept[i][0]
            g_in = closed_form.dense_backward(layers[i], h_in, params[layers[i][0]], g, grads, moving,
                                              input_grad=i > lowest, trained=trained)
            if g_in is not None:
                _, a, keep = kept[i - 1]
                g = closed_form.relu_backward_(g_in if keep is None else g_in.mul_(keep), a)
        return loss, grads


class LogisticRegression(MLP):
    """A single linear layer with softmax (an MLP without hidden layers)."""

    def __init__(self, in_features: int, n_classes: int):
        super().__init__(in_features, [], n_classes, 0.0)


def flat_size(shape: Sequence[int]) -> int:
    return int(math.prod(shape))
