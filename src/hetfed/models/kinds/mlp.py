"""``mlp``: in → hidden… → classes, ReLU, dropout after every hidden layer (:class:`~hetfed.models.mlp.MLP`)."""

from __future__ import annotations

from hetfed.models.kinds import ModelKind, WidthsParams, register
from hetfed.models.mlp import MLP, flat_size


def build(shape, n_classes, vocab_size, hidden, dropout):
    return MLP(flat_size(shape), hidden, n_classes, dropout)


register(ModelKind("mlp", build, "a multilayer perceptron: ReLU, dropout after every hidden layer",
                   Params=WidthsParams))
