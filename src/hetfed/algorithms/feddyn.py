"""FedDyn (Acar, Zhao, Matas, Mattina, Whatmough, Saligrama 2021, "Federated Learning Based on Dynamic
Regularization", Algorithm 1).

Each client k keeps the gradient state ∇L_k(θ_k^{t−1}) (zero at first: client-local, it never
leaves the client). A sampled client starts from the server model θ^{t−1} and minimises its
dynamically regularised loss

    L_k(θ) − ⟨∇L_k(θ_k^{t−1}), θ⟩ + (α/2)·‖θ − θ^{t−1}‖²

(the two extra terms are a regulariser on the local training loss, so any local optimiser and
schedule apply: a :class:`~hetfed.engine.local.Proximal` term, α and θ^{t−1}, with the shift −∇L_k(θ_k^{t−1}),
their gradient added in closed form), uploads θ_k^t, and updates its state

    ∇L_k(θ_k^t) = ∇L_k(θ_k^{t−1}) − α·(θ_k^t − θ^{t−1}).

The server keeps h (zero at first):

    h^t = h^{t−1} − α·(1/m)·Σ_{k∈P_t} (θ_k^t − θ^{t−1})      (m: every client of the federation)
    θ^t = (1/|P_t|)·Σ_{k∈P_t} θ_k^t − (1/α)·h^t

Differences from the paper, said in docs/methods.md: the average of the θ_k^t is hetfed's server
pipeline — FedAvg's sample-weighted mean (or a robust rule, DP noise, a server optimiser),
so Σ_{k∈P_t}(θ_k^t − θ^{t−1}) is taken as |P_t|·(average − θ^{t−1}); with equal client sizes
and the default server (sgd, lr 1) the two are the paper's update exactly.
"""

from __future__ import annotations

import torch
from pydantic import Field

from hetfed.algorithms.fedavg import FedAvg, train_clients
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.local import Proximal
from hetfed.engine.types import Broadcast, ClientData, ClientState, ServerState, Upload, beside_model, split_state
from hetfed.interface import server_step
from hetfed.models.base import without

#: client state: the client's ∇L_k(θ_k^{t−1}) per shared parameter
GRAD = "feddyn.grad."


class FedDynParams(AlgorithmParams):
    alpha: float = Field(0.01, gt=0, description="α, the dynamic regulariser's weight (the paper: 0.1, 0.01, 0.001)")


class FedDyn(FedAvg):
    """FedAvg with dynamic regularisation (see the module docstring)."""

    n_clients: int | None = None

    def bind(self, fed, seed: int = 0, per_round: int = 1) -> None:
        super().bind(fed, seed, per_round)
        self.n_clients = fed.n_clients  # m in h's update: every client of the federation

    def server_init(self, gen: torch.Generator) -> ServerState:
        params = self.model.init_shared(gen)
        return ServerState(params, 0, {"h": {k: torch.zeros_like(v) for k, v in params.items()}})

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        state = super().client_init(client_id, gen)
        return {**state, **{GRAD + s.name: torch.zeros(s.shape) for s in self.model.specs() if not s.local}}

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n, alpha = len(data.client_ids), self.params.alpha
        names = list(bc.params)
        grad = {k: states[GRAD + k].detach() for k in names}
        rest = without(states, GRAD)
        anchor = bc.stacked(n)
        local, kept_opt = split_state(rest)

        # −⟨∇L_k(θ_k^{t−1}), θ⟩ + α/2·‖θ − θ^{t−1}‖² per client: added to the step's gradients by its closed form
        dynamic = Proximal({k: anchor[k] for k in names}, alpha, {k: -grad[k] for k in names})
        params, opt_state, loss = train_clients(self, {**anchor, **local}, kept_opt, data, bc.lr, dynamic)
        new_grad = {GRAD + k: (grad[k] - alpha * (params[k] - anchor[k])).detach() for k in names}
        upload = Upload.of(data, params, names, loss)
        return upload, {**{k: params[k] for k in local}, **opt_state, **new_grad}

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        if not upload.client_ids:
            return ServerState(state.params, state.round + 1, state.extra)
        average, extra = server_step(self, state, upload)
        alpha = self.params.alpha
        share = len(upload.client_ids) / (self.n_clients or len(upload.client_ids))
        h = beside_model(state.extra.get("h"), state.params)
        new_h = {k: h[k] - alpha * share * (average[k] - state.params[k]) for k in state.params}
        params = {k: average[k] - new_h[k] / alpha for k in state.params}
        return ServerState(params, state.round + 1, {**extra, "h": new_h})


register(AlgorithmSpec(
    "feddyn", FedDyn, "FedAvg with a dynamic regulariser per client (its own gradient state) and a server "
    "correction h, so that the clients' stationary points agree with the global one",
    "Acar et al. 2021, Federated Learning Based on Dynamic Regularization", FedDynParams,
    Capabilities(stacks_runs=True, private=True, compact_steps=True),
    privacy=(
        PrivacyRow(
            method="FedDyn",
            config="`algorithm: feddyn`",
            params="shared model parameters",
            extra="`train_loss`",
            stays="data; its gradient state ∇L_k(θ_k) (`feddyn.grad.<name>`); optimiser state when kept",
        ),
    ),
    family="heterogeneity-specific", venue="ICLR 2021",
))
