"""FedAvg (McMahan et al. 2017), FedProx (Li et al. 2020) and the Local baseline."""

from __future__ import annotations

import torch
from pydantic import Field

from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine import optim
from hetfed.engine.local import Objective, Proximal, StackObjective, train_stack
from hetfed.engine.types import Broadcast, ClientData, ClientState, ServerState, Upload, split_state
from hetfed.interface import Algorithm


class FedAvg(Algorithm):
    """Clients start from the global model, train locally, upload shared params + counts.

    Local parameters a model declares (none for plain models) stay in the client
    state; so does the optimiser state when ``optimizer.reset_each_round`` is off.
    """

    def _regulariser(self, bc: Broadcast, data: ClientData):
        """An extra per-client training loss ``f(params) -> [n]`` for this stack, or None (FedAvg)."""
        return None

    def _objective(self, bc: Broadcast, data: ClientData, states: ClientState) -> Objective | StackObjective | None:
        """The clients' training loss in place of the model's cross-entropy (``engine.local.Objective``) for
        this stack, or None (FedAvg)."""
        return None

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        shared = bc.stacked(n)
        local, kept_opt = split_state(states)
        params, opt_state, loss = train_clients(self, {**shared, **local}, kept_opt, data, bc.lr,
                                                self._regulariser(bc, data), self._objective(bc, data, states))
        upload = Upload.of(data, params, bc.params, loss)
        return upload, {**{k: params[k] for k in local}, **opt_state}

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        shapes = {s.name: torch.zeros(s.shape) for s in self.model.specs()}
        return {**self.model.init_local(gen), **kept_optimizer_state(self.train, shapes)}

    def shared_step(self) -> str | None:
        """FedAvg's client step — :meth:`local_update` with no regulariser or objective of a subclass's — reads none
        of the method's parameters: a method that trains its clients with it unchanged (kNN-Per, FedMoE, FedDF, and
        FedPer's or LG-FedAvg's with their own parts kept local) runs FedAvg's computation, so a stacked sweep trains
        its runs' clients in one stack with FedAvg's (given the same network, schedule, optimiser, broadcast and
        client states: :func:`hetfed.executors.stacked_work.step_key`). None where a subclass changes the step
        (FedProx's proximal term)."""
        kind = type(self)
        own = (kind.local_update, kind._regulariser, kind._objective)
        return "FedAvg's step" if own == (FedAvg.local_update, FedAvg._regulariser, FedAvg._objective) else None


def train_clients(algo: Algorithm, params, kept_opt: ClientState, data: ClientData, lr: float, regulariser=None,
                  objective: Objective | StackObjective | None = None, trainable: list[str] | None = None):
    """Train a stack from its kept optimiser state (fresh when reset each round).

    Returns the trained params, the optimiser state the clients keep ({} when
    it is reset each round) and each client's mean training loss. ``trainable``: the parameters that move
    (default: all; the others are inputs held fixed).
    """
    opt_cfg = algo.train.optimizer
    start = kept_opt if kept_opt and not opt_cfg.reset_each_round else None
    params, opt_state, loss = train_stack(algo.model, params, data, algo.schedule, opt_cfg, lr, start, regulariser,
                                          trainable=trainable, objective=objective)
    return params, ({} if opt_cfg.reset_each_round else opt_state), loss


def kept_optimizer_state(train, params: dict[str, torch.Tensor]) -> ClientState:
    """Zero optimiser state for one client when it is kept across rounds, else {}.

    Every client's state must have the same keys from the start, so clients
    that have not trained yet can be stacked with those that have.
    """
    if train.optimizer.reset_each_round:
        return {}
    stacked = optim.init_state(train.optimizer, {k: v.unsqueeze(0) for k, v in params.items()})
    return {k: v[0] for k, v in stacked.items()}


class FedProxParams(AlgorithmParams):
    mu: float = Field(0.01, ge=0, description="μ, the proximal weight of μ/2·‖θ − θ_global‖²")


class FedProx(FedAvg):
    """FedAvg plus ``μ/2·‖θ − θ_global‖²`` on the shared parameters (``params.mu``)."""

    def _regulariser(self, bc: Broadcast, data: ClientData):
        return Proximal(bc.params, self.params.mu)  # μ/2·‖θ − θ_global‖², by its closed-form gradient


class Local(Algorithm):
    """Every client trains its own model from scratch on its own data; nothing is shared."""


    def server_init(self, gen: torch.Generator) -> ServerState:
        return ServerState(params={})

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        params = {**self.model.init_shared(gen), **self.model.init_local(gen)}
        return {**params, **kept_optimizer_state(self.train, params)}

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        return ServerState(params={}, round=state.round + 1)

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        params, kept_opt = split_state(states)
        params, opt_state, loss = train_clients(self, params, kept_opt, data, bc.lr)
        upload = Upload(list(data.client_ids), {}, data.sizes(loss.device), {"train_loss": loss})
        return upload, {**params, **opt_state}


register(AlgorithmSpec(
    "fedavg", FedAvg, "clients train the global model locally; the server averages them, weighted by samples",
    "McMahan et al. 2017, Communication-Efficient Learning of Deep Networks from Decentralized Data",
    capabilities=Capabilities(private=True, stacks_runs=True, plain_steps=True),
    privacy=(
        PrivacyRow(
            method="FedAvg",
            config="`algorithm: fedavg`",
            params="shared model parameters",
            extra="`train_loss` (its mean training loss)",
            stays="data; optimiser state when kept",
        ),
        PrivacyRow(
            method="CGAU",
            config="`algorithm: fedavg` + `model.kind: cgau`",
            params="shared `W`, `b` of every layer",
            extra="`train_loss`",
            stays="conditioning rows `V_f h`, `V_g h` (and `out.cond` if enabled)",
        ),
    ),
    family="global", venue="AISTATS 2017",
))
register(AlgorithmSpec(
    "fedprox", FedProx, "FedAvg with a proximal term μ/2·‖θ − θ_global‖² in the clients' loss",
    "Li et al. 2020, Federated Optimization in Heterogeneous Networks", FedProxParams,
    Capabilities(private=True, stacks_runs=True, plain_steps=True), legacy_train={"prox_mu": "mu"},
    privacy=(
        PrivacyRow(
            method="FedProx",
            config="`algorithm: fedprox`",
            params="shared model parameters",
            extra="`train_loss`",
            stays="data; optimiser state when kept",
        ),
    ),
    family="heterogeneity-specific", venue="MLSys 2020",
))
register(AlgorithmSpec(
    "local", Local, "every client trains its own model on its own data; nothing is shared (a baseline)",
    "—", capabilities=Capabilities(uploads="nothing but the sample count and training loss", server_model=False,
                                   buffers="local",
                                   personalises=True, plain_steps=True, stacks_runs=True),
    privacy=(
        PrivacyRow(
            method="Local",
            config="`algorithm: local`",
            params="nothing",
            extra="`train_loss`",
            stays="every parameter",
        ),
    ),
    family="personalised", venue="",
))
