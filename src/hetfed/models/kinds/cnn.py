"""``cnn``: LeNet-style (conv 6 → conv 16 → fc 120 → fc 84 → classes) — :class:`~hetfed.models.cnn.LeNet`."""

from __future__ import annotations

from hetfed.models.cnn import LeNet
from hetfed.models.kinds import ModelKind, register


def build(shape, n_classes, vocab_size):
    return LeNet(shape, n_classes)


register(ModelKind("cnn", build, "LeNet-style: conv 6 → conv 16 → fc 120 → fc 84 → classes"))
