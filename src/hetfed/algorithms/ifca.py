"""IFCA (Ghosh et al. 2020, "An Efficient Framework for Clustered Federated Learning").

The server keeps ``k`` cluster models θ_1…θ_k (``params.clusters``; independent
random draws). Each round it sends all of them; a sampled client estimates its
cluster as ĵ = argmin_j F_i(θ_j) — the mean loss of each model on its training
data —, trains θ_ĵ with the run's local SGD and uploads it with ĵ (Algorithm 2,
the model-averaging variant). The server averages, per cluster, the models of
the clients that chose it (weighted by samples, through the server pipeline, so
robust rules and server optimisers apply per cluster); a cluster nobody chose
keeps its model.

At evaluation a client picks the model with the lowest loss on its *validation*
split (its own data, as in training; the paper's inference rule) and scores it.

The upload holds every cluster's parameters under ``ifca.<j>.<name>``: the one the
client trained, and the k − 1 others exactly as received (so the server's norm
screen and non-finite checks compare each with what was sent). The server
needs the whole round at once to split it by cluster.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from pydantic import Field

from hetfed.algorithms._clusters import ClusterModels
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.evaluate import predict
from hetfed.engine.types import (
    Broadcast,
    Params,
    ServerState,
    Upload,
)
from hetfed.interface import CLUSTERS


class IFCAParams(AlgorithmParams):
    clusters: int = Field(2, ge=1, description="k, the number of cluster models (1: FedAvg)")


class IFCA(ClusterModels):
    """k cluster models; each client trains the one that fits its data best."""

    PREFIX = "ifca"
    NO_SAVED_PREDICTION = "IFCA picks a client's cluster model by its loss on the client's validation data"

    def server_init(self, gen: torch.Generator) -> ServerState:
        draws = [self.model.init_shared(gen) for _ in range(self.params.clusters)]
        return ServerState({self.key(j, k): v for j, d in enumerate(draws) for k, v in d.items()})

    @torch.no_grad()
    def choose(self, bc: Broadcast, models: list[Params], local: Params, x: torch.Tensor, y: torch.Tensor,
               index: list, ids: list[int]) -> torch.Tensor:
        """Per client, the cluster whose model has the lowest mean loss on ``index`` (its data); 0 when it has none."""
        n = len(index)
        losses = torch.full((n, len(models)), float("inf"))
        for j, model in enumerate(models):
            for i, logits in enumerate(predict(self.model, {**model, **local}, x, index)):
                if len(index[i]):
                    losses[i, j] = F.cross_entropy(logits, y[torch.as_tensor(index[i], device=y.device)]).item()
        return losses.argmin(1)

    def upload_extra(self, chosen: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"cluster": chosen.to(torch.float32)}

    def findings(self, state: ServerState, upload: Upload) -> Mapping[str, float | torch.Tensor]:
        """The cluster model each client chose and trained this round (its upload's index)."""
        return {CLUSTERS: upload.extra["cluster"].long().cpu()}

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        """Per cluster, the server pipeline over the clients that chose it; the others keep their model."""
        cluster = upload.extra["cluster"].long().cpu()
        params, extra = dict(state.params), dict(state.extra)
        for j, model in enumerate(self._models(state.params)):
            rows = torch.nonzero(cluster == j, as_tuple=True)[0]
            if len(rows):
                self.cluster_step(model, upload, rows, j, j, state.round, params, extra)
        return ServerState(params, state.round + 1, extra)


register(AlgorithmSpec(
    "ifca", IFCA, "k cluster models; each client trains (and predicts with) the one with the lowest loss on its data",
    "Ghosh et al. 2020, An Efficient Framework for Clustered Federated Learning", IFCAParams,
    Capabilities(uploads="every cluster model's parameters (the chosen one trained, the others as received), its "
                         "cluster index, sample count, training loss", whole_round=True, personalises=True,
                 stacks_runs=True),
    privacy=(
        PrivacyRow(
            method="IFCA",
            config="`algorithm: ifca`",
            params="every cluster model's parameters (`ifca.<j>.<name>`: the chosen one trained, the k − 1 others "
                   "exactly as received)",
            extra="`train_loss`; **`cluster`: the index of the cluster model it chose (one number)**",
            stays="data; optimiser state when kept",
        ),
    ),
    family="clustered", venue="NeurIPS 2020",
))
