"""``logreg``: multinomial logistic regression on the flattened inputs."""

from __future__ import annotations

from hetfed.models.kinds import ModelKind, register
from hetfed.models.mlp import LogisticRegression, flat_size


def build(shape, n_classes, vocab_size):
    return LogisticRegression(flat_size(shape), n_classes)


register(ModelKind("logreg", build, "multinomial logistic regression on the flattened inputs"))
