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

from collections.abc import Iterable, Mapping
from functools import reduce

import torch
from pydantic import Field

from hetfed.algorithms._clusters import ClusterModels
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.types import (
    Broadcast,
    Params,
    ServerState,
    Upload,
)
from hetfed.interface import CLUSTERS

ASSIGNMENT = "cfl.cluster_of"  # the server's cluster of every client (server state and broadcast)
NORMS = "cfl.update_norms"  # the round's ‖mean Δθ‖ and max ‖Δθ_i‖ of each cluster in it (server state)


class CFLParams(AlgorithmParams):
    eps1: float = Field(0.4, gt=0, description="ε₁: split only when the norm of the members' mean update is below")
    eps2: float = Field(1.6, gt=0, description="ε₂: … and the largest member update norm is above")
    warmup_rounds: int = Field(20, ge=0, description="no split before this many rounds (the authors' code: 20)")


def padded(of: torch.Tensor, size: int) -> torch.Tensor:
    """The assignment (or rows of assignments) long enough for client ids below ``size`` (clients not yet known
    are in cluster 0)."""
    short = size - of.shape[-1]
    return of if short <= 0 else torch.cat([of, torch.zeros(*of.shape[:-1], short, dtype=of.dtype)], -1)


def update_gram(deltas: Iterable[torch.Tensor]) -> torch.Tensor:
    """The Gram matrix [m, m] (float64) of m clients' whole updates, summed over their parameters' ``[m, ...]``
    deltas: everything Algorithm 1 reads of the updates — the norms (:func:`gram_norms`) and the cosine
    similarities (:func:`bipartition`) — without a copy of the updates as one float64 matrix every round."""
    return reduce(torch.add, (f @ f.T for f in (d.flatten(1).double() for d in deltas)))


def gram_norms(gram: torch.Tensor) -> tuple[float, float]:
    """‖mean_i Δθ_i‖ and max_i ‖Δθ_i‖ from the updates' Gram matrix (‖Σ_i Δθ_i‖² is the sum of its entries)."""
    total, largest = torch.stack([gram.sum(), gram.diagonal().max()]).clamp_min(0).sqrt().tolist()  # one read
    return total / gram.shape[0], largest


def bipartition(gram: torch.Tensor) -> tuple[list[int], list[int]]:
    """Two groups of m updates, given their Gram matrix [m, m]: complete-linkage clustering of −cosine
    similarity."""
    from sklearn.cluster import AgglomerativeClustering

    norm = gram.diagonal().clamp_min(0).sqrt().clamp_min(1e-12)
    similarity = (gram / norm[:, None] / norm[None, :]).cpu().numpy()
    labels = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete").fit(-similarity).labels_
    return [i for i in range(len(gram)) if labels[i] == 0], [i for i in range(len(gram)) if labels[i] == 1]


class CFL(ClusterModels):
    """Clusters split recursively by the cosine similarity of their members' updates."""

    PREFIX = "cfl"
    NO_SAVED_PREDICTION = "CFL's server assigns each client its cluster"

    def bind(self, fed, seed: int = 0, per_round: int = 1) -> None:
        super().bind(fed, seed, per_round)
        self._n_clients = fed.n_clients

    def server_init(self, gen: torch.Generator) -> ServerState:
        first = self.model.init_shared(gen)
        n = getattr(self, "_n_clients", 0)
        return ServerState({self.key(0, k): v for k, v in first.items()}, extra={ASSIGNMENT: torch.zeros(n)})

    def broadcast(self, state: ServerState, round: int) -> Broadcast:
        bc = super().broadcast(state, round)
        return Broadcast(bc.params, bc.round, bc.lr, {ASSIGNMENT: state.extra[ASSIGNMENT]})

    def choose(self, bc: Broadcast, models: list[Params], local: Params, x: torch.Tensor, y: torch.Tensor,
               index: list, ids: list[int]) -> torch.Tensor:
        """The cluster the server assigned each client (sent in the broadcast: each client reads its own run's
        table, a stacked sweep's clients coming from several runs)."""
        if not bc.has_extra(ASSIGNMENT):
            return torch.zeros(len(ids), dtype=torch.long)
        tables = padded(bc.extra_rows(ASSIGNMENT, len(ids)).long().cpu(), max(ids, default=-1) + 1)
        return tables[torch.arange(len(ids)), torch.as_tensor(ids, dtype=torch.long)]

    def findings(self, state: ServerState, upload: Upload) -> Mapping[str, float | torch.Tensor]:
        """The server's cluster of each client after this round's splits, and Algorithm 1's two norms
        (:func:`norm_findings`)."""
        cluster = padded(state.extra[ASSIGNMENT].long().cpu(), max(upload.client_ids, default=-1) + 1)[
            torch.as_tensor(upload.client_ids, dtype=torch.long)]
        return {CLUSTERS: cluster, **norm_findings(state.extra.get(NORMS))}

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        """Split the clusters that meet Algorithm 1's criterion, then average each cluster's updates."""
        of = padded(state.extra[ASSIGNMENT].clone(), max(upload.client_ids, default=-1) + 1)
        params, extra = dict(state.params), dict(state.extra)
        ids = torch.as_tensor(upload.client_ids)
        opt_key = self.context.pipeline.STATE
        names = self._names()
        norms: list[tuple[float, float]] = []
        for c, model in enumerate(self._models(state.params)):
            rows = torch.nonzero(of[ids] == c, as_tuple=True)[0]
            if not len(rows):
                continue
            members = torch.nonzero(of == c, as_tuple=True)[0]
            groups, targets = [rows], [c]
            gram = update_gram(upload.params[self.key(c, k)][rows.to(upload.params[self.key(c, k)].device)]
                               - model[k].unsqueeze(0) for k in names)
            mean_norm, max_norm = gram_norms(gram)
            norms.append((mean_norm, max_norm))
            warm = state.round >= self.params.warmup_rounds and len(members) > 2 and len(rows) == len(members)
            if warm and mean_norm < self.params.eps1 and max_norm > self.params.eps2:
                a, b = bipartition(gram)
                new = len(self._models(params))  # the second group becomes a new cluster, from this model
                groups, targets = [rows[a], rows[b]], [c, new]
                of[ids[rows[b]]] = float(new)
                params.update({self.key(new, k): v.clone() for k, v in model.items()})
                if self.key(c, opt_key) in state.extra:
                    extra[self.key(new, opt_key)] = state.extra[self.key(c, opt_key)]
            for group, target in zip(groups, targets, strict=True):  # each cluster: its members' mean update
                self.cluster_step(model, upload, group, c, target, state.round, params, extra)
        extra[ASSIGNMENT] = of
        extra[NORMS] = torch.tensor(norms, dtype=torch.float64).reshape(-1, 2)
        return ServerState(params, state.round + 1, extra)


def norm_findings(norms: torch.Tensor | None) -> dict[str, float]:
    """Algorithm 1's two norms of the round, which ε₁ and ε₂ are compared with (written every round, warm-up
    included, so a user can choose them from a run — the authors' code logs them too): ``update_norm_mean``,
    ‖mean_i Δθ_i‖, and ``update_norm_max``, max_i ‖Δθ_i‖; with several clusters in the round, the smallest
    mean norm and the largest update norm over them (each the figure nearest its threshold). ``norms``: the
    round's [clusters, 2]."""
    if norms is None or not len(norms):
        return {}
    return {"update_norm_mean": float(norms[:, 0].min()), "update_norm_max": float(norms[:, 1].max())}


register(AlgorithmSpec(
    "cfl", CFL, "one cluster at first, split in two by the cosine similarity of its members' updates when its mean "
    "update is near stationary; each cluster has its model",
    "Sattler, Müller, Samek 2020, Clustered Federated Learning: Model-Agnostic Distributed Multitask Optimization "
    "Under Privacy Constraints", CFLParams,
    Capabilities(uploads="every cluster model's parameters (its own trained, the others as received), sample count, "
                         "training loss", whole_round=True, personalises=True, stacks_runs=True),
    quick={"warmup_rounds": 1},
    privacy=(
        PrivacyRow(
            method="CFL",
            config="`algorithm: cfl`",
            params="every cluster model's parameters (`cfl.<c>.<name>`: its own cluster's trained, the others exactly "
                   "as received)",
            extra="`train_loss`",
            stays="data; optimiser state when kept",
        ),
    ),
    family="clustered", venue="IEEE TNNLS 2021",
))
