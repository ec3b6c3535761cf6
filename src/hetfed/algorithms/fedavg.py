"""FedAvg (McMahan et al. 2017), FedProx (Li et al. 2020) and the Local baseline."""

from __future__ import annotations

import torch

from hetfed.algorithms.base import Algorithm
from hetfed.engine import optim
from hetfed.engine.local import train_stack
from hetfed.engine.types import Broadcast, ClientData, ClientState, ServerState, Upload


class FedAvg(Algorithm):
    """Clients start from the global model, train locally, upload shared params + counts.

    Local parameters a model declares (none for plain models) stay in the client
    state; so does the optimiser state when ``optimizer.reset_each_round`` is off.
    """

    name = "fedavg"

    def _regulariser(self, bc: Broadcast):
        return None

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        shared = {k: v.unsqueeze(0).expand(n, *v.shape) for k, v in bc.params.items()}
        local = {k: v for k, v in states.items() if not k.startswith("opt.")}
        kept_opt = {k: v for k, v in states.items() if k.startswith("opt.")}
        params = {**shared, **local}
        opt_cfg = self.train.optimizer
        opt_state = kept_opt if (kept_opt and not opt_cfg.reset_each_round) else optim.init_state(opt_cfg, params)
        params, opt_state, loss = train_stack(
            self.model, params, data, self.schedule, opt_cfg, bc.lr, opt_state, self._regulariser(bc)
        )
        upload = Upload(
            client_ids=list(data.client_ids),
            params={k: params[k] for k in bc.params},
            num_samples=data.sizes().to(loss.device),
            extra={"train_loss": loss},
        )
        new_state = {k: params[k] for k in local}
        if not opt_cfg.reset_each_round:
            new_state.update(opt_state)
        return upload, new_state

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        local = self.model.init_local(gen)
        shapes = {**{s.name: torch.zeros(s.shape) for s in self.model.specs()}}
        return {**local, **kept_optimizer_state(self.train, shapes)}


def kept_optimizer_state(train, params: dict[str, torch.Tensor]) -> ClientState:
    """Zero optimiser state for one client when it is kept across rounds, else {}.

    Every client's state must have the same keys from the start, so clients
    that have not trained yet can be stacked with those that have.
    """
    if train.optimizer.reset_each_round:
        return {}
    stacked = optim.init_state(train.optimizer, {k: v.unsqueeze(0) for k, v in params.items()})
    return {k: v[0] for k, v in stacked.items()}


class FedProx(FedAvg):
    """FedAvg plus ``μ/2·‖θ − θ_global‖²`` on the shared parameters (``train.prox_mu``)."""

    name = "fedprox"

    def _regulariser(self, bc: Broadcast):
        mu = self.train.prox_mu
        anchor = bc.params

        def prox(params):
            total = 0
            for k, g in anchor.items():
                diff = params[k] - g.unsqueeze(0)
                total = total + diff.pow(2).flatten(1).sum(1)
            return 0.5 * mu * total

        return prox


class Local(Algorithm):
    """Every client trains its own model from scratch on its own data; nothing is shared."""

    name = "local"
    personalised = True  # type: ignore[assignment]  # every parameter is the client's own
    has_global_model = False

    def server_init(self, gen: torch.Generator) -> ServerState:
        return ServerState(params={})

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        params = {**self.model.init_shared(gen), **self.model.init_local(gen)}
        return {**params, **kept_optimizer_state(self.train, params)}

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        return ServerState(params={}, round=state.round + 1)

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        params = {k: v for k, v in states.items() if not k.startswith("opt.")}
        kept_opt = {k: v for k, v in states.items() if k.startswith("opt.")}
        opt_cfg = self.train.optimizer
        opt_state = kept_opt if (kept_opt and not opt_cfg.reset_each_round) else optim.init_state(opt_cfg, params)
        params, opt_state, loss = train_stack(self.model, params, data, self.schedule, opt_cfg, bc.lr, opt_state)
        upload = Upload(list(data.client_ids), {}, data.sizes().to(loss.device), {"train_loss": loss})
        new_state = dict(params)
        if not opt_cfg.reset_each_round:
            new_state.update(opt_state)
        return upload, new_state
