"""How well a backdoor took (``attack.kind: backdoor``): the share of the stamped test samples a model labels the
attack's target — the server's model (``backdoor_accuracy``) and, for a method whose clients predict with models of
their own, each honest client's model as the client evaluates it (``local_backdoor_accuracy_mean``): whether
personalisation keeps a backdoor planted in the shared model out of the clients' own predictions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass(frozen=True, eq=False)
class BackdoorTest:
    """The global test set's samples of the other classes, stamped (``x``), labelled the ``target`` (``y``); and the
    clients whose own models are scored on it: the honest opted-in ones."""

    x: torch.Tensor
    y: torch.Tensor
    honest: list[int]


def client_backdoor_accuracy(reports: dict[str, list[Any]]) -> float | None:
    """The clients' mean share of the stamped samples their own models label the target, from their reports of an
    evaluation that scored the backdoor's test set as its global test set (each client's ``global_accuracy``, the
    target its label); None when the clients' models are not their own (a shared model reports no such score) or no
    client reported one."""
    shares = np.asarray([v for v in reports.get("global_accuracy", []) if np.isfinite(v)], dtype=np.float64)
    return float(shares.mean()) if len(shares) else None
