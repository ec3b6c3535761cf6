"""``cnn4``: McMahan et al.'s FedAvg CNN (two 5×5 convolutions 32, 64 → fc 512 → classes), with optional batch
normalisation (FedBN) — :class:`~hetfed.models.cnn.FedAvgCNN`."""

from __future__ import annotations

from pydantic import Field

from hetfed.models.cnn import FedAvgCNN
from hetfed.models.kinds import ModelKind, register
from hetfed.registry import ComponentParams


class CNN4Params(ComponentParams):
    batch_norm: bool = Field(False, description="batch normalisation after each convolution and the hidden fully "
                             "connected layer (running statistics kept per client: FedBN)")


def build(shape, n_classes, vocab_size, batch_norm):
    return FedAvgCNN(shape, n_classes, batch_norm)


register(ModelKind("cnn4", build, "McMahan et al.'s FedAvg CNN: conv 32 → conv 64 → fc 512 → classes",
                   Params=CNN4Params))
