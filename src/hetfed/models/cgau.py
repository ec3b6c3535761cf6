"""Conditional gated activation units (Rieger, Høegh et al. 2020, "Client Adaptation").

One CGAU layer: ``z = tanh(W_f x + b_f + V_f h) ⊙ σ(W_g x + b_g + V_g h)``, with
``h`` the client's one-hot id. ``V_f h`` and ``V_g h`` are one row of ``V_f``,
``V_g`` per client, so each client holds just its own rows — declared *local*:
created on the client (zeros), trained there, kept across rounds, never
uploaded. ``W``/``b`` are shared and aggregated by FedAvg. The filter (tanh) lets
a client shift *what* a feature is; the gate (σ) *whether* it is active.

A client never seen in training is served with zero conditioning — the global
part alone (:meth:`Model.local_for_unseen_client`).

``condition_output`` also adds a per-client bias to the logits, as the authors'
public code does; off by default (the paper's equations condition only the
hidden units).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hetfed.models import closed_form
from hetfed.models.base import (
    Model,
    Noise,
    Params,
    ParamSpec,
    dense,
    dropout,
    fan_in_init,
    zeros_init,
)
from hetfed.models.sgd_in_backward import SGDInBackward


class CGAUNet(Model):
    """in → CGAU(hidden[0]) → dropout → CGAU(hidden[1]) → … → dropout → linear → classes."""

    def __init__(self, in_features: int, hidden: Sequence[int], n_classes: int, dropout: float = 0.5,
                 condition_output: bool = False):
        self.in_features = in_features
        self.hidden = list(hidden)
        self.n_classes = n_classes
        self.p = dropout
        self.condition_output = condition_output
        specs: list[ParamSpec] = []
        fan_in = in_features
        for i, units in enumerate(self.hidden):
            init = fan_in_init(fan_in)
            specs += [
                ParamSpec(f"cgau.{i}.filter.weight", (fan_in, units), init),
                ParamSpec(f"cgau.{i}.filter.bias", (units,), init),
                ParamSpec(f"cgau.{i}.gate.weight", (fan_in, units), init),
                ParamSpec(f"cgau.{i}.gate.bias", (units,), init),
                ParamSpec(f"cgau.{i}.filter.cond", (units,), zeros_init, local=True),
                ParamSpec(f"cgau.{i}.gate.cond", (units,), zeros_init, local=True),
            ]
            fan_in = units
        init = fan_in_init(fan_in)
        specs += [ParamSpec("out.weight", (fan_in, n_classes), init), ParamSpec("out.bias", (n_classes,), init)]
        if condition_output:
            specs.append(ParamSpec("out.cond", (n_classes,), zeros_init, local=True))
        self._specs = specs
        #: each layer's filter and gate (weight, bias, conditioning row) names, input side first (set here, with the
        #: specs: a model's attributes are part of what a stacked sweep compares)
        self._units: list[tuple[tuple[str, str, str], ...]] = [
            tuple((f"cgau.{i}.{u}.weight", f"cgau.{i}.{u}.bias", f"cgau.{i}.{u}.cond") for u in ("filter", "gate"))
            for i in range(len(self.hidden))]

    def specs(self) -> list[ParamSpec]:
        return self._specs

    def units(self, params: Params, x: torch.Tensor, use_filter_cond: bool = True,
              use_gate_cond: bool = True) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """(filter, gate) activations of every layer, without dropout (for analysis/plots)."""
        out = []
        h = x.flatten(2)
        for i in range(len(self.hidden)):
            f, g = self._pre(params, h, i, use_filter_cond, use_gate_cond)
            f, g = torch.tanh(f), torch.sigmoid(g)
            out.append((f, g))
            h = f * g
        return out

    def _pre(self, params: Params, h: torch.Tensor, i: int, use_f: bool = True, use_g: bool = True):
        f = dense(h, params[f"cgau.{i}.filter.weight"], params[f"cgau.{i}.filter.bias"])
        g = dense(h, params[f"cgau.{i}.gate.weight"], params[f"cgau.{i}.gate.bias"])
        if use_f:
            f = f + params[f"cgau.{i}.filter.cond"].unsqueeze(1)
        if use_g:
            g = g + params[f"cgau.{i}.gate.cond"].unsqueeze(1)
        return f, g

    @property
    def head_names(self) -> tuple[str, ...]:
        return ("out.weight", "out.bias", "out.cond") if self.condition_output else ("out.weight", "out.bias")

    @property
    def latent_dim(self) -> int:
        return self.hidden[-1] if self.hidden else self.in_features

    def features(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        h = x.flatten(2)
        for i in range(len(self.hidden)):
            f, g = self._pre(params, h, i)
            h = dropout(torch.tanh(f) * torch.sigmoid(g), self.p, noise)
        return h

    def head(self, params: Params, z: torch.Tensor) -> torch.Tensor:
        logits = dense(z, params["out.weight"], params["out.bias"])
        if self.condition_output:
            logits = logits + params["out.cond"].unsqueeze(1)
        return logits

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        return self.head(params, self.features(params, x, noise))

    def activation_floats(self, batch: int) -> int:
        return 6 * batch * (self.in_features + 2 * sum(self.hidden) + self.n_classes)

    def closed_form(self, names: set[str]) -> closed_form.ClosedForm | None:
        """This network's step written out, training ``names`` (any of its parameters, the others held fixed: the
        conditioning rows alone, say), with its own forward."""
        return closed_form.for_names(self, CGAUNet, names, self._loss_and_gradients,
                                     ("forward", "features", "head", "_pre"))

    def _loss_and_gradients(self, params: Params, x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor, noise: Noise,
                            moving: SGDInBackward | None, trained: frozenset[str] | None = None
                            ) -> tuple[torch.Tensor, Params]:
        """:meth:`forward`'s cross-entropy per client and its gradients (``trained``: of those parameters; None: all).
        A unit ``z = tanh(f)·σ(g)``: ``∂f = ∂z·σ(g)·(1 − tanh²f)``, ``∂g = ∂z·tanh f·σ(g)·(1 − σ(g))``; a
        conditioning row's gradient is its pre-activation's summed over the batch, as its bias's."""
        h, kept = x.flatten(2), []
        for i in range(len(self.hidden)):
            f, g = self._pre(params, h, i)
            t, s = f.tanh_(), g.sigmoid_()
            keep = noise.keep_mask(t.shape[1], t.shape[2], self.p) if self.p > 0 else None
            kept.append((h, t, s, keep))
            h = t * s if keep is None else (t * s).mul_(keep)
        loss, g_out = closed_form.cross_entropy(self.head(params, h), y, mask)
        grads: Params = {}
        if self.condition_output and (trained is None or "out.cond" in trained):
            grads["out.cond"] = g_out.sum(1)
        units = self._units
        lowest = closed_form.lowest_trained([(*f, *g) for f, g in units] + [("out.weight", "out.bias", "out.cond")],
                                            trained)
        g_in = closed_form.dense_backward(("out.weight", "out.bias"), h, params["out.weight"], g_out, grads, moving,
                                          input_grad=len(kept) > lowest, trained=trained)
        for i in range(len(self.hidden) - 1, lowest - 1, -1):
            h_in, t, s, keep = kept[i]
            assert g_in is not None  # the layer above handed its input's gradient down
            dz = g_in if keep is None else g_in.mul_(keep)
            df = (dz * s).mul_(1 - t * t)
            dg = dz.mul_(t).mul_(s * (1 - s))
            through = []
            for (weight, bias, cond), d in zip(units[i], (df, dg), strict=True):
                if trained is None or cond in trained:
                    grads[cond] = d.sum(1)
                through.append(closed_form.dense_backward((weight, bias), h_in, params[weight], d, grads, moving,
                                                          input_grad=i > lowest, trained=trained))
            g_in = through[0].add_(through[1]) if through[0] is not None and through[1] is not None else None
        return loss, grads
