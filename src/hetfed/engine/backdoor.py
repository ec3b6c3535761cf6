"""How well a backdoor took (``attack.kind: backdoor``): the share of the stamped test samples a model labels the
attack's target — the server's model (``backdoor_accuracy``) and, for a method whose clients predict with parameters
of their own, each honest client's model (``local_backdoor_accuracy_mean``): whether personalisation keeps a backdoor
planted in the shared model out of the clients' own predictions."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import torch

from hetfed.engine.evaluate import Predictor, predict


@dataclass(frozen=True, eq=False)
class BackdoorTest:
    """The global test set's samples of the other classes, stamped (``x``), labelled the ``target`` (``y``); and the
    clients whose own models are scored on it: the honest opted-in ones."""

    x: torch.Tensor
    y: torch.Tensor
    honest: list[int]


def client_backdoor_accuracy(stacks: Iterable[tuple[list[int], Predictor]], test: BackdoorTest) -> float:
    """The mean over the clients of ``stacks`` (each a stack of clients and what they predict with) of the share of
    ``test``'s samples each one's model labels the target (NaN for no client)."""
    every = np.arange(len(test.y))
    shares: list[torch.Tensor] = []
    for chunk, pred in stacks:
        for logits in predict(pred.model, pred.params, test.x, [every] * len(chunk)):
            shares.append((logits.argmax(-1) == test.y).double().mean())
    return float(torch.stack(shares).mean()) if shares else float("nan")
