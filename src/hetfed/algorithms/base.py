"""The algorithm interface: a few pure functions over explicit state.

An algorithm never knows which executor runs it: ``local_update`` receives a
stack of clients (one client, a chunk, or all of them) and returns their
:class:`Upload` and new local states. Everything random comes from generators
derived from the run seed.
"""

from __future__ import annotations

import torch

from hetfed.config import TrainConfig
from hetfed.engine.local import LocalSchedule
from hetfed.engine.types import (
    Broadcast,
    ClientData,
    ClientState,
    Params,
    ServerState,
    Upload,
    split_state,
)
from hetfed.models.base import Model


class Algorithm:
    """Base class with FedAvg's server side; subclasses change what they need."""

    name = "base"
    #: True when the server keeps a model that can be evaluated on its own
    has_global_model = True

    def __init__(self, model: Model, train: TrainConfig):
        self.model = model
        self.train = train
        self.schedule = LocalSchedule.from_train(train)

    @property
    def personalised(self) -> bool:
        """True when clients predict with parameters of their own (the model's local ones)."""
        return bool(self.model.local_names)

    # -- server side
    def server_init(self, gen: torch.Generator) -> ServerState:
        return ServerState(params=self.model.init_shared(gen))

    def broadcast(self, state: ServerState, round: int) -> Broadcast:
        lr = self.train.optimizer.lr * self.train.lr_decay**round
        return Broadcast(params=state.params, round=round, lr=lr)

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        """FedAvg: sample-count-weighted mean, moved by the server learning rate."""
        return ServerState(
            params=weighted_average(state.params, upload, self.train.server_lr),
            round=state.round + 1,
            extra=state.extra,
        )

    # -- client side
    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        return self.model.init_local(gen)

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        raise NotImplementedError

    # -- evaluation
    def eval_params(self, state: ServerState, states: ClientState, n: int) -> Params:
        """Stacked params each client predicts with (shared + its local ones)."""
        shared = {k: v.unsqueeze(0).expand(n, *v.shape) for k, v in state.params.items()}
        local, _ = split_state(states)
        return {**shared, **local}

    def global_params(self, state: ServerState) -> Params:
        """Stacked (n = 1) params of the server's model, for the global test set.

        Local parameters take their value for a client never seen in training.
        """
        unseen = {k: v.to(_device(state.params)) for k, v in self.model.local_for_unseen_client().items()}
        return {k: v.unsqueeze(0) for k, v in {**state.params, **unseen}.items()}


def _device(params: Params) -> torch.device:
    return next(iter(params.values())).device if params else torch.device("cpu")


def weighted_average(old: Params, upload: Upload, server_lr: float = 1.0) -> Params:
    """``old + η·(Σ_k w_k θ_k − old)`` with ``w_k ∝`` the clients' sample counts."""
    w = upload.num_samples / upload.num_samples.sum()
    out = {}
    for k, v in old.items():
        stacked = upload.params[k]
        avg = torch.tensordot(w.to(stacked.dtype), stacked, dims=1)
        out[k] = avg if server_lr == 1.0 else v + server_lr * (avg - v)
    return out
