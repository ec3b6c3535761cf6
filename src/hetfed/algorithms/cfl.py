"""CFL (Sattler, Müller, Samek 2020, "Clustered Federated Learning: Model-Agnostic Distributed
Multitask Optimization Under Privacy Constraints").

The server starts with one cluster of every client and one model. Each round, every
sampled client trains its cluster's model and uploads it; the server takes each
client's update Δθ_i. A cluster whose members' mean update is near stationary while
some client still moves much — ‖mean_i Δθ_i‖ < ``params.eps1`` and max_i ‖Δθ_i‖ >
``params.eps2`` (Algorithm 1), after ``params.warmup_rounds`` rounds and with more than
two members — is bi-partitioned by the cosine similarities of its members' updates:
complete-linkage agglomerative clustering of −cos(Δθ_i, Δθ_j) into two groups (as the
authors' code, with scikit-learn). Each resulting cluster starts from the cluster's
model and then, like every cluster, gets the sample-weighted mean of its members'
updates through the server pipeline (robust rules and server optimisers apply per
cluster). A client predicts with its cluster's model.

The server sends every cluster's model and the cluster of every client
(``cfl.cluster_of``, so each client trains its own); a client uploads all cluster models
(its own trained, the others as received), so the norm screen compares each with what
was sent. A cluster is split only when all its members took part in the round (the
paper's clients all take part every round). ε₁, ε₂ depend on the model and the
learning rate: the defaults are the authors' example's (0.4, 1.6), not universal.
"""

from __future__ import annotations

import torch
from pydantic import Field

from hetfed.algorithms.fedavg import FedAvg, train_clients
from hetfed.algorithms.registry import AlgorithmParams, AlgorithmSpec, Capabilities, register
from hetfed.engine.types import (
    Broadcast,
    ClientData,
    ClientState,
    Params,
    ServerState,
    Upload,
    split_state,
)
from hetfed.errors import ConfigError
from hetfed.interface import ClientEvalData, Predictor, client_scores

ASSIGNMENT = "cfl.cluster_of"  # the server's cluster of every client (server state and broadcast)


class CFLParams(AlgorithmParams):
    eps1: float = Field(0.4, gt=0, description="ε₁: split only when the norm of the members' mean update is below")
    eps2: float = Field(1.6, gt=0, description="ε₂: … and the largest member update norm is above")
    warmup_rounds: int = Field(20, ge=0, description="no split before this many rounds (the authors' code: 20)")


def key(c: int, name: str) -> str:
    return f"cfl.{c}.{name}"


def padded(of: torch.Tensor, size: int) -> torch.Tensor:
    """The assignment long enough for client ids below ``size`` (clients not yet known are in cluster 0)."""
    return of if len(of) >= size else torch.cat([of, torch.zeros(size - len(of), dtype=of.dtype)])


def bipartition(updates: torch.Tensor) -> tuple[list[int], list[int]]:
    """Two groups of the rows of ``updates`` [m, d]: complete-linkage clustering of −cosine similarity."""
    from sklearn.cluster import AgglomerativeClustering

    u = updates.double()
    unit = u / u.norm(dim=1, keepdim=True).clamp_min(1e-12)
    similarity = (unit @ unit.T).cpu().numpy()
    labels = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete").fit(-similarity).labels_
    return [i for i in range(len(u)) if labels[i] == 0], [i for i in range(len(u)) if labels[i] == 1]


class CFL(FedAvg):
    """Clusters split recursively by the cosine similarity of their members' updates."""

    personalised = True  # type: ignore[assignment]

    def _names(self) -> list[str]:
        return [s.name for s in self.model.specs() if not s.local]

    def _clusters(self, params: Params) -> int:
        return len({k.split(".")[1] for k in params if k.startswith("cfl.") and k != ASSIGNMENT})

    def _model(self, params: Params, c: int) -> Params:
        return {n: params[key(c, n)] for n in self._names()}

    def bind(self, fed, seed: int = 0, per_round: int = 1) -> None:
        super().bind(fed, seed, per_round)
        self._n_clients = fed.n_clients

    def server_init(self, gen: torch.Generator) -> ServerState:
        first = self.model.init_shared(gen)
        n = getattr(self, "_n_clients", 0)
        return ServerState({key(0, k): v for k, v in first.items()}, extra={ASSIGNMENT: torch.zeros(n)})

    def broadcast(self, state: ServerState, round: int) -> Broadcast:
        bc = super().broadcast(state, round)
        return Broadcast(bc.params, bc.round, bc.lr, {ASSIGNMENT: state.extra[ASSIGNMENT]})

    def _own(self, bc: Broadcast, ids: list[int]) -> tuple[list[Params], torch.Tensor]:
        models = [self._model(bc.params, c) for c in range(self._clusters(bc.params))]
        of = padded(bc.extra.get(ASSIGNMENT, torch.zeros(0)).long().cpu(), max(ids, default=-1) + 1)
        return models, of[torch.as_tensor(ids, dtype=torch.long)]

    @staticmethod
    def _gather(models: list[Params], chosen: torch.Tensor) -> Params:
        return {k: torch.stack([models[int(c)][k] for c in chosen]) for k in models[0]}

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        local, kept_opt = split_state(states)
        models, mine = self._own(bc, data.client_ids)
        params, opt_state, loss = train_clients(self, {**self._gather(models, mine), **local}, kept_opt, data, bc.lr)
        own = mine.to(loss.device)
        upload = {}
        for c, model in enumerate(models):
            for name, received in model.items():
                picked = (own == c).view(-1, *([1] * received.dim()))
                upload[key(c, name)] = torch.where(picked, params[name], received.unsqueeze(0).expand(n, *received.shape))
        return (Upload(list(data.client_ids), upload, data.sizes().to(loss.device), {"train_loss": loss}),
                {**{k: params[k] for k in local}, **opt_state})

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        """Split the clusters that meet Algorithm 1's criterion, then average each cluster's updates."""
        of = padded(state.extra[ASSIGNMENT].clone(), max(upload.client_ids, default=-1) + 1)
        params, extra = dict(state.params), dict(state.extra)
        ids = torch.as_tensor(upload.client_ids)
        opt_key = self.context.pipeline.STATE
        names = self._names()
        for c in range(self._clusters(state.params)):
            rows = torch.nonzero(of[ids] == c, as_tuple=True)[0]
            if not len(rows):
                continue
            model = self._model(state.params, c)
            members = torch.nonzero(of == c, as_tuple=True)[0]
            groups, targets = [rows], [c]
            if state.round >= self.params.warmup_rounds and len(members) > 2 and len(rows) == len(members):
                delta = torch.cat([(upload.params[key(c, k)][rows.to(upload.params[key(c, k)].device)]
                                    - model[k].unsqueeze(0)).flatten(1).double() for k in names], 1)
                mean_norm, max_norm = float(delta.mean(0).norm()), float(delta.norm(dim=1).max())
                if mean_norm < self.params.eps1 and max_norm > self.params.eps2:
                    a, b = bipartition(delta)
                    new = self._clusters(params)  # the second group becomes a new cluster, from this model
                    groups, targets = [rows[a], rows[b]], [c, new]
                    of[ids[rows[b]]] = float(new)
                    params.update({key(new, k): v.clone() for k, v in model.items()})
                    if f"cfl.{c}.{opt_key}" in state.extra:
                        extra[f"cfl.{new}.{opt_key}"] = state.extra[f"cfl.{c}.{opt_key}"]
            for group, target in zip(groups, targets, strict=True):  # each cluster: its members' mean update
                sub = Upload([upload.client_ids[i] for i in group.tolist()],
                             {k: upload.params[key(c, k)][group.to(upload.params[key(c, k)].device)] for k in names},
                             upload.num_samples[group.to(upload.num_samples.device)])
                mine = ServerState(model, state.round, {opt_key: extra.get(f"cfl.{target}.{opt_key}", {})})
                new_params, new_extra = self.server_step(mine, sub)
                params.update({key(target, k): v for k, v in new_params.items()})
                if new_extra.get(opt_key):
                    extra[f"cfl.{target}.{opt_key}"] = new_extra[opt_key]
        extra[ASSIGNMENT] = of
        return ServerState(params, state.round + 1, extra)

    @torch.no_grad()
    def evaluate_server(self, state: ServerState, x_global: torch.Tensor, y_global: torch.Tensor) -> dict[str, float]:
        """No single global model: the global test set is scored by each client's cluster model."""
        return {}

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """Not from states alone: CFL's client-to-cluster assignment is server state that run directories do not keep yet (evaluation does it in :meth:`evaluate_client`)."""
        raise ConfigError(f"client predictions of a saved {self.name} run are not supported yet: CFL's client-to-cluster assignment is server state that run directories do not keep yet; "
                          "expected the run's metrics (metrics.csv, summary.json) instead")

    @torch.no_grad()
    def evaluate_client(self, bc: Broadcast, states: ClientState, data: ClientEvalData,
                        view: str | None = None) -> dict[str, list[float]]:
        local, _ = split_state(states)
        models, mine = self._own(bc, data.client_ids)
        return client_scores(Predictor(self.model, {**self._gather(models, mine), **local}, True), data)


register(AlgorithmSpec(
    "cfl", CFL, "one cluster at first, split in two by the cosine similarity of its members' updates when its mean "
    "update is near stationary; each cluster has its model",
    "Sattler, Müller, Samek 2020, Clustered Federated Learning: Model-Agnostic Distributed Multitask Optimization "
    "Under Privacy Constraints", CFLParams,
    Capabilities(uploads="every cluster model's parameters (its own trained, the others as received), sample count, "
                         "training loss", whole_round=True, personalises=True),
    quick={"warmup_rounds": 1},
))
