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

import torch
import torch.nn.functional as F
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
from hetfed.interface import ClientEvalData, Predictor, client_scores, predict


class IFCAParams(AlgorithmParams):
    clusters: int = Field(2, ge=1, description="k, the number of cluster models (1: FedAvg)")


def key(j: int, name: str) -> str:
    return f"ifca.{j}.{name}"


class IFCA(FedAvg):
    """k cluster models; each client trains the one that fits its data best."""

    personalised = True  # type: ignore[assignment]  # clients predict with different cluster models

    def _models(self, params: Params) -> list[Params]:
        names = [s.name for s in self.model.specs() if not s.local]
        return [{name: params[key(j, name)] for name in names} for j in range(self.params.clusters)]

    def server_init(self, gen: torch.Generator) -> ServerState:
        draws = [self.model.init_shared(gen) for _ in range(self.params.clusters)]
        return ServerState({key(j, k): v for j, d in enumerate(draws) for k, v in d.items()})

    @torch.no_grad()
    def _choose(self, models: list[Params], local: Params, x: torch.Tensor, y: torch.Tensor,
                index: list) -> torch.Tensor:
        """Per client, the cluster whose model has the lowest mean loss on ``index`` (its data); 0 when it has none."""
        n = len(index)
        losses = torch.full((n, len(models)), float("inf"))
        for j, model in enumerate(models):
            stacked = {**{k: v.unsqueeze(0).expand(n, *v.shape) for k, v in model.items()}, **local}
            for i, logits in enumerate(predict(self.model, stacked, x, index)):
                if len(index[i]):
                    losses[i, j] = F.cross_entropy(logits, y[torch.as_tensor(index[i], device=y.device)]).item()
        return losses.argmin(1)

    @staticmethod
    def _gather(models: list[Params], chosen: torch.Tensor) -> Params:
        return {k: torch.stack([models[int(c)][k] for c in chosen]) for k in models[0]}

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        local, kept_opt = split_state(states)
        models = self._models(bc.params)
        chosen = self._choose(models, local, data.x, data.y, data.indices)
        params, opt_state, loss = train_clients(self, {**self._gather(models, chosen), **local}, kept_opt, data, bc.lr)
        mine = chosen.to(loss.device)
        upload = {}
        for j, model in enumerate(models):
            for name, received in model.items():
                picked = (mine == j).view(-1, *([1] * received.dim()))
                upload[key(j, name)] = torch.where(picked, params[name], received.unsqueeze(0).expand(n, *received.shape))
        extra = {"train_loss": loss, "cluster": chosen.to(loss.device, torch.float32)}
        return Upload(list(data.client_ids), upload, data.sizes().to(loss.device), extra), \
            {**{k: params[k] for k in local}, **opt_state}

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        """Per cluster, the server pipeline over the clients that chose it; the others keep their model."""
        models = self._models(state.params)
        cluster = upload.extra["cluster"].long().cpu()
        params, extra = dict(state.params), dict(state.extra)
        opt_key = self.context.pipeline.STATE
        for j, model in enumerate(models):
            rows = torch.nonzero(cluster == j, as_tuple=True)[0]
            if not len(rows):
                continue
            sub = Upload([upload.client_ids[i] for i in rows.tolist()],
                         {name: upload.params[key(j, name)][rows.to(upload.params[key(j, name)].device)]
                          for name in model},
                         upload.num_samples[rows.to(upload.num_samples.device)])
            mine = ServerState(model, state.round, {opt_key: state.extra.get(f"ifca.{j}.{opt_key}", {})})
            new, new_extra = self.server_step(mine, sub)
            params.update({key(j, name): v for name, v in new.items()})
            if new_extra.get(opt_key):
                extra[f"ifca.{j}.{opt_key}"] = new_extra[opt_key]
        return ServerState(params, state.round + 1, extra)

    @torch.no_grad()
    def evaluate_server(self, state: ServerState, x_global: torch.Tensor, y_global: torch.Tensor) -> dict[str, float]:
        """No single global model: the global test set is scored by each client's chosen cluster model."""
        return {}

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """Not from states alone: IFCA picks a client's cluster model by its loss on the client's validation data (evaluation does it in :meth:`evaluate_client`)."""
        raise ConfigError(f"client predictions of a saved {self.name} run are not supported yet: IFCA picks a client's cluster model by its loss on the client's validation data; "
                          "expected the run's metrics (metrics.csv, summary.json) instead")

    @torch.no_grad()
    def evaluate_client(self, bc: Broadcast, states: ClientState, data: ClientEvalData,
                        view: str | None = None) -> dict[str, list[float]]:
        local, _ = split_state(states)
        models = self._models(bc.params)
        chosen = self._choose(models, local, data.x, data.y, data.val)
        return client_scores(Predictor(self.model, {**self._gather(models, chosen), **local}, True), data)


register(AlgorithmSpec(
    "ifca", IFCA, "k cluster models; each client trains (and predicts with) the one with the lowest loss on its data",
    "Ghosh et al. 2020, An Efficient Framework for Clustered Federated Learning", IFCAParams,
    Capabilities(uploads="every cluster model's parameters (the chosen one trained, the others as received), its "
                         "cluster index, sample count, training loss", whole_round=True, personalises=True),
))
