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

from collections.abc import Sequence

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
from hetfed.engine.types import Broadcast, ClientData, ClientState, Params, ServerState, Upload, split_state
from hetfed.models.base import linear_init, prefixed

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
    """θ̄^l = Σ_j (α^l[j] / Σ α^l) θ_j^l per stacked client (its own θ^l where every weight is 0), for runs stacked:
    ``alpha`` [R, n, N] per layer, each run's personal models ``personal`` [R, N, …], ``client`` [R, n]; [R, n, …]."""
    out = {}
    for name, a in alpha.items():
        own = torch.nn.functional.one_hot(client, a.shape[-1]).to(a)
        total = a.sum(-1, keepdim=True)
        w = torch.where(total > 0, a / torch.where(total > 0, total, torch.ones_like(total)), own)
        theta = personal[name].to(w)
        out[name] = torch.bmm(w, theta.flatten(2)).view(*w.shape[:2], *theta.shape[2:])
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

    def _aggregates(self, state: ServerState, ids: torch.Tensor) -> Params:
        phi = {k: v[ids] for k, v in state.extra["hypernetworks"].items()}
        alpha = {k: v.unsqueeze(0) for k, v in layer_weights(phi, ids, self._layers()).items()}
        personal = {k: v.unsqueeze(0) for k, v in state.extra["personal"].items()}
        return {k: v[0] for k, v in aggregate_layers(alpha, personal, ids.unsqueeze(0)).items()}

    def broadcast(self, state: ServerState, round: int) -> Broadcast:
        bc = super().broadcast(state, round)
        with torch.no_grad():
            models = self._aggregates(state, torch.arange(self._clients))
        return Broadcast({}, bc.round, bc.lr, bc.extra, personal=prefixed(models, AGGREGATE))

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        local, kept_opt = split_state(states)
        start = {k: bc.personal[AGGREGATE + k] for k in self._layers()}
        params, opt_state, loss = train_clients(self, {**start, **local}, kept_opt, data, bc.lr)
        upload = Upload(list(data.client_ids), {k: params[k] for k in self._layers()}, data.sizes(loss.device),
                        {"train_loss": loss})
        return upload, {**{k: params[k] for k in local}, **opt_state}

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        return self.aggregate_runs([self], [state], [upload])[0]

    def aggregate_key(self, state: ServerState, upload: Upload) -> tuple:
        """Runs (of the same parameters and model) step their clients' hypernetworks in one stack when they hold them
        on one device, for federations of one size, and as many clients answered (a sweep's seeds)."""
        embeddings = state.extra["hypernetworks"]["embeddings"]
        return (str(embeddings.device), tuple(embeddings.shape), len(upload.client_ids))

    @classmethod
    def aggregate_runs(cls, algos: Sequence[PFedLA], states: Sequence[ServerState],
                       uploads: Sequence[Upload]) -> list[ServerState]:
        """Per client: its hypernetwork's SGD step and its personal model moved by its update — every client of every
        run at once. FL-bench takes the clients in turn, but a client's step reads only its own hypernetwork and the
        round's personal models (its aggregate is recomputed from those it was built from), so the steps are
        independent: one forward and one vector-Jacobian product for all of them, each run's numbers as alone."""
        hyper, personal = ({k: torch.stack([s.extra[part][k] for s in states]) for k in states[0].extra[part]}
                           for part in ("hypernetworks", "personal"))
        if uploads[0].client_ids:
            _step_clients(algos[0], hyper, personal, uploads)
        # each run's rows copied out: a view would keep (and a checkpoint would save) every run's stack
        return [ServerState({}, s.round + 1, {**s.extra, "hypernetworks": {k: v[r].clone() for k, v in hyper.items()},
                                              "personal": {k: v[r].clone() for k, v in personal.items()}})
                for r, s in enumerate(states)]

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


def _step_clients(algo: PFedLA, hyper: Params, personal: Params, uploads: Sequence[Upload]) -> None:
    """:meth:`PFedLA.aggregate_runs`' steps on the runs' stacked hypernetworks ``hyper`` and personal models
    ``personal`` ([R, N, …], new tensors, updated in place): each answering client's hypernetwork stepped along the
    vector-Jacobian product of its aggregate with ``θ̄_i − θ̃_i``, its personal model moved by its update."""
    layers, device = algo._layers(), hyper["embeddings"].device
    ids = torch.stack([torch.as_tensor(u.client_ids, dtype=torch.long, device=device) for u in uploads])  # [R, K]
    runs = torch.arange(len(uploads), device=device).unsqueeze(1)
    phi = {k: v[runs, ids].requires_grad_(True) for k, v in hyper.items()}  # each client's own, [R, K, …]
    with torch.enable_grad():
        alpha = layer_weights({k: v.flatten(0, 1) for k, v in phi.items()}, ids.flatten(), layers)
        sent = aggregate_layers({k: v.view(*ids.shape, -1) for k, v in alpha.items()}, personal, ids)
        change = {k: (v - torch.stack([u.params[k].detach().to(v) for u in uploads])).detach()
                  for k, v in sent.items()}
        grads = torch.autograd.grad(list(sent.values()), list(phi.values()), grad_outputs=list(change.values()),
                                    allow_unused=True)
    for (name, leaf), g in zip(phi.items(), grads, strict=True):
        if g is not None:
            hyper[name][runs, ids] = (leaf - algo.params.server_lr * g).detach()
    for k in personal:
        personal[k][runs, ids] -= change[k].to(personal[k])
