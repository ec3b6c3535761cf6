"""pFedLA (Ma, Zhang, Guo, Xu 2022, "Layer-wised Model Aggregation for Personalized Federated Learning", CVPR), as
FL-bench's ``pfedla`` (k = 0, the method without its heuristic variant).

The server keeps every client's personal model θ_j (all start from one draw) and, for each client i, a
hypernetwork of its own: an embedding table, an MLP (three layers of ``params.hidden`` units with ReLU) and one
linear output per parameter tensor l of the model, ``α_i^l = ReLU(W_l·MLP(v_i) + b_l)`` ∈ R^N (output weights
start uniform in [0, 1), biases at 0: FL-bench's initialisation). Client i receives its layer-wise aggregate
``θ̄_i^l = Σ_j (α_i^l[j] / Σ_j' α_i^l[j']) θ_j^l`` (its own θ_i^l where every weight is 0) — sent to it alone
(:attr:`Broadcast.personal`) — trains it to θ̃_i and uploads it. The server then, per client in turn:

- steps client i's hypernetwork with SGD (``params.server_lr`` 5e-3, no momentum: FL-bench's) along the
  vector-Jacobian product of θ̄_i with ``θ̄_i − θ̃_i`` (the change the client's training made, reversed: a
  descent on the client's loss, as pFedHN's server step);
- moves the client's personal model by its update: ``θ_i ← θ_i − (θ̄_i − θ̃_i)``.

A client predicts with its aggregate θ̄_i; there is no global model.

**A sign to know about**: FL-bench passes ``−(θ̄_i − θ̃_i)`` as the vector-Jacobian product's direction and then
steps SGD, which by our reading moves θ̄_i *away* from the trained model (an ascent); pFedHN's authors pass
``θ̄ − θ̃`` (the descent). hetfed takes the descent. The paper's own update rule could not be checked here.
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
from hetfed.engine.evaluate import Predictor
from hetfed.engine.types import (
    Broadcast,
    ClientData,
    ClientState,
    Params,
    ServerState,
    Upload,
    split_state,
)
from hetfed.models.base import linear_init

#: a client's aggregate of parameter ``name`` in its personal row
AGGREGATE = "la."


class PFedLAParams(AlgorithmParams):
    hidden: int = Field(100, ge=1, description="units of each hypernetwork's MLP (FL-bench's --hidden_dim 100)")
    embedding: int = Field(100, ge=1, description="the client embedding's size (FL-bench's --embedding_dim 100)")
    server_lr: float = Field(5e-3, gt=0, description="the hypernetworks' SGD learning rate (FL-bench's --hn_lr)")


def hypernetwork(gen: torch.Generator, clients: int, embedding: int, hidden: int, layers: list[str]) -> Params:
    """One client's hypernetwork: ``embeddings`` [N, e], ``mlp.<j>.*`` (3 layers), ``out.<layer>.*`` [N, h]."""
    phi = {"embeddings": torch.randn(clients, embedding, generator=gen)}
    for j, (a, b) in enumerate(((embedding, hidden), (hidden, hidden), (hidden, hidden))):
        phi[f"mlp.{j}.weight"], phi[f"mlp.{j}.bias"] = linear_init(gen, a, b)
    for name in layers:
        phi[f"out.{name}.weight"] = torch.rand(clients, hidden, generator=gen)  # torch.nn.init.uniform_
        phi[f"out.{name}.bias"] = torch.zeros(clients)
    return phi


def layer_weights(phi: Params, client: torch.Tensor, layers: list[str]) -> dict[str, torch.Tensor]:
    """α^l for each stacked client's own hypernetwork (``phi`` entries [n, …], ``client`` [n]): [n, N] per layer."""
    z = phi["embeddings"][torch.arange(len(client)), client]  # each hypernetwork's own client row
    for j in range(3):
        z = torch.relu(torch.einsum("ni,noi->no", z, phi[f"mlp.{j}.weight"]) + phi[f"mlp.{j}.bias"])
    return {name: torch.relu(torch.einsum("nh,nch->nc", z, phi[f"out.{name}.weight"]) + phi[f"out.{name}.bias"])
            for name in layers}


def aggregate_layers(alpha: dict[str, torch.Tensor], personal: Params, client: torch.Tensor) -> Params:
    """θ̄^l = Σ_j (α^l[j] / Σ α^l) θ_j^l per stacked client (its own θ^l where every weight is 0)."""
    out = {}
    for name, a in alpha.items():
        own = torch.nn.functional.one_hot(client, a.shape[1]).to(a)
        total = a.sum(1, keepdim=True)
        w = torch.where(total > 0, a / torch.where(total > 0, total, torch.ones_like(total)), own)
        out[name] = torch.tensordot(w, personal[name].to(w), dims=([1], [0]))
    return out


class PFedLA(FedAvg):
    """A hypernetwork per client learns how much of each other client's layers its model takes."""


    def _layers(self) -> list[str]:
        return [s.name for s in self.model.specs() if not s.local]

    def server_init(self, gen: torch.Generator) -> ServerState:
        first = self.model.init_shared(gen)
        n, p = max(self._clients, 1), self.params
        one = hypernetwork(gen, n, p.embedding, p.hidden, self._layers())  # every client's starts the same
        phi = {k: v.unsqueeze(0).repeat(n, *([1] * v.dim())) for k, v in one.items()}
        personal = {k: v.unsqueeze(0).repeat(n, *([1] * v.dim())) for k, v in first.items()}
        return ServerState({}, 0, {"hypernetworks": phi, "personal": personal})

    def _aggregates(self, state: ServerState, ids: torch.Tensor, phi: Params | None = None) -> Params:
        phi = phi if phi is not None else {k: v[ids] for k, v in state.extra["hypernetworks"].items()}
        alpha = layer_weights(phi, ids, self._layers())
        return aggregate_layers(alpha, state.extra["personal"], ids)

    def broadcast(self, state: ServerState, round: int) -> Broadcast:
        bc = super().broadcast(state, round)
        with torch.no_grad():
            models = self._aggregates(state, torch.arange(self._clients))
        return Broadcast({}, bc.round, bc.lr, bc.extra, personal={AGGREGATE + k: v for k, v in models.items()})

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        local, kept_opt = split_state(states)
        start = {k: bc.personal[AGGREGATE + k] for k in self._layers()}
        params, opt_state, loss = train_clients(self, {**start, **local}, kept_opt, data, bc.lr)
        upload = Upload(list(data.client_ids), {k: params[k] for k in self._layers()}, data.sizes().to(loss.device),
                        {"train_loss": loss})
        return upload, {**{k: params[k] for k in local}, **opt_state}

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        """Per client: its hypernetwork's SGD step and its personal model moved by its update (each client's
        hypernetwork is its own, and its aggregate is recomputed from the personal models it was built from)."""
        phis = {k: v.clone() for k, v in state.extra["hypernetworks"].items()}
        personal = {k: v.clone() for k, v in state.extra["personal"].items()}
        for row, cid in sorted(enumerate(upload.client_ids), key=lambda r: r[1]):
            ids = torch.tensor([cid])
            phi = {k: v[cid:cid + 1].clone().requires_grad_(True) for k, v in phis.items()}
            with torch.enable_grad():
                sent = self._aggregates(state, ids, phi)  # what it was sent: the round's personal models
                change = {k: (v - upload.params[k][row:row + 1].detach().to(v)).detach() for k, v in sent.items()}
                grads = torch.autograd.grad(list(sent.values()), list(phi.values()),
                                            grad_outputs=list(change.values()), allow_unused=True)
            for (name, leaf), g in zip(phi.items(), grads, strict=True):
                if g is not None:
                    phis[name][cid] = (leaf - self.params.server_lr * g)[0].detach()
            for k in personal:
                personal[k][cid] -= change[k][0].to(personal[k])
        return ServerState({}, state.round + 1, {**state.extra, "hypernetworks": phis, "personal": personal})

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """Each client predicts with its layer-wise aggregate."""
        local, _ = split_state(states)
        return Predictor(self.model, {**{k: bc.personal[AGGREGATE + k] for k in self._layers()}, **local}, True)


register(AlgorithmSpec(
    "pfedla", PFedLA, "a hypernetwork per client on the server learns layer-wise weights over every client's model "
                      "for that client's aggregate",
    "Ma et al. 2022, Layer-wised Model Aggregation for Personalized Federated Learning", PFedLAParams,
    Capabilities(uploads="its trained model, sample count, training loss", whole_round=True, server_model=False,
                 personalises=True, per_client=True, stacks_runs=True),
    privacy=(
        PrivacyRow(
            method="pFedLA",
            config="`algorithm: pfedla`",
            params="its whole trained model (the server mixes it into other clients' models)",
            extra="`train_loss`",
            stays="data; optimiser state when kept (its hypernetwork and personal model live on the server)",
        ),
    ),
    family="personalised", venue="CVPR 2022",
))
