"""What the algorithms that keep part of the model on each client share (FedPer, FedRep, LG-FedAvg).

The *algorithm* splits the model's parameters (the model only declares its head,
:attr:`hetfed.models.base.Model.head_names`): the server holds and aggregates the
shared part through the server pipeline; the personal part lives in each client's
state, like CGAU's conditioning rows, and never leaves the client. Every client's
personal part starts from the same draw as the server's part (the run seed's
server initialisation), so at round 0 every client holds exactly FedAvg's
initial model and the methods differ from FedAvg only by what they keep.

Not a registered algorithm (the registry skips modules starting with ``_``).
"""

from __future__ import annotations

from dataclasses import replace

import torch

from hetfed.algorithms.build import METHOD_KEY
from hetfed.algorithms.fedavg import FedAvg, kept_optimizer_state
from hetfed.engine.rng import LOCAL_PHASE, SERVER_INIT, derive_seeds, torch_gen
from hetfed.engine.types import ClientData, ClientState, Params, ServerState
from hetfed.errors import ConfigError
from hetfed.models.base import Model


def head_of(model: Model, algorithm: str) -> tuple[str, ...]:
    """The model's classifier head (its last layer), refused for a model that declares none."""
    names = model.head_names
    if not names:
        raise ConfigError(f"{METHOD_KEY}algorithm = {algorithm!r} is not allowed with a {type(model).__name__}: it "
                          "declares no body/head split; expected a model kind with a head (mlp, cnn, cgau, bilstm)")
    return tuple(names)


def body_of(model: Model, algorithm: str) -> tuple[str, ...]:
    """Every parameter of the model that is neither the head nor local to the model (CGAU's rows);
    refused when there is none (a linear model is all head)."""
    head = set(head_of(model, algorithm))
    body = tuple(s.name for s in model.specs() if not s.local and s.name not in head)
    if not body:
        raise ConfigError(f"{METHOD_KEY}algorithm = {algorithm!r} is not allowed with a model without hidden "
                          "layers (model.hidden = []): it splits the model into a body and a head; expected at least "
                          "one hidden layer")
    return body


def initial_model(algo) -> Params:
    """The server's initial draw of the whole model (the run seed's), computed once per algorithm object:
    where every client's personal part starts, so that round 0 is FedAvg's model."""
    if getattr(algo, "_start", None) is None:
        algo._start = algo.model.init_shared(torch_gen(algo.context.seed, SERVER_INIT))
    return algo._start


def second_pass(data: ClientData, phase: int) -> ClientData:
    """The same clients' data with seeds of their own for another pass in the same round (its own batch
    order and dropout masks, still independent of which clients share the stack)."""
    return replace(data, seeds=derive_seeds([(s, LOCAL_PHASE, phase) for s in data.seeds]))


class PartlyPersonal(FedAvg):
    """FedAvg on the shared part; :meth:`personal_names` stay on the clients.

    A client trains ``{shared from the broadcast, its personal part}`` and uploads
    the shared part only (FedAvg's ``local_update`` does this unchanged: what is
    not in the broadcast stays in the client state).
    """


    def __init__(self, model, train, params=None, context=None):
        super().__init__(model, train, params, context)
        self._body = body_of(model, self.spec.name)  # every method of this family needs a body and a head

    def personal_names(self) -> tuple[str, ...]:
        raise NotImplementedError

    def server_init(self, gen: torch.Generator) -> ServerState:
        personal = set(self.personal_names())
        return ServerState({k: v for k, v in self.model.init_shared(gen).items() if k not in personal})

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        start = initial_model(self)
        personal = {k: start[k].clone() for k in self.personal_names()}
        shapes = {s.name: torch.zeros(s.shape) for s in self.model.specs()}
        return {**self.model.init_local(gen), **personal, **kept_optimizer_state(self.train, shapes)}

    @torch.no_grad()
    def evaluate_server(self, state: ServerState, x_global: torch.Tensor, y_global: torch.Tensor) -> dict[str, float]:
        """No complete model lives on the server: the global test set is scored by the clients' own models."""
        return {}
