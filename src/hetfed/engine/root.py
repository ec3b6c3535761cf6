"""The server's own model of a round trained on its labelled root set: FLTrust's server update (Cao et al., NDSS
2021, Algorithm 1: ``ModelUpdate(w, D_0, b, β, R_l)``, the clients' local training on the root set).

From the round's reference model, the run's own local schedule (epochs or steps, batch size), optimiser and learning
rate at that round — a client's training, with the root set as the one client: its batches drawn from the run seed
and the round, a fresh optimiser state each round (as a client that keeps none), never DP-SGD (the server's data is
its own). A model's local parameters (CGAU's rows) take their value for a client never seen, held fixed; only the
shared parameters move. Whatever the method's client step adds (a proximal term, a personal model), the server's is
this plain one: the paper's."""

from __future__ import annotations

import numpy as np
import torch

from hetfed.config import OptimizerConfig
from hetfed.engine.local import LocalSchedule, train_stack
from hetfed.engine.rng import ROOT_ROUND, derive_seed
from hetfed.engine.types import ClientData, Params
from hetfed.models.base import Model


def root_model(model: Model, reference: Params, x: torch.Tensor, y: torch.Tensor, schedule: LocalSchedule,
               optimizer: OptimizerConfig, lr: float, seed: int, rnd: int) -> Params:
    """The shared parameters ``reference`` after the schedule's local training on the root set ``(x, y)`` (moved
    to the reference's device)."""
    device = next(iter(reference.values())).device
    full = {**reference, **model.local_for_unseen_client(device)}
    data = ClientData([0], x.to(device), y.to(device), [np.arange(len(y))], [derive_seed(seed, ROOT_ROUND, rnd)])
    trained, _, _ = train_stack(model, {k: v.unsqueeze(0) for k, v in full.items()}, data, schedule, optimizer, lr,
                                trainable=list(reference))
    return {k: trained[k][0] for k in reference}
