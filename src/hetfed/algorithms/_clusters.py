"""What the clustered algorithms share (IFCA, CFL): several cluster models on the server, each client
training the one it belongs to.

The server's parameters are every cluster's model under ``<prefix>.<c>.<name>``; the broadcast sends
them all. A client trains its cluster's model and uploads *every* cluster's parameters — its own
trained, the others exactly as received — so the server's norm screen and non-finite checks compare
each with what was sent; the server then runs its pipeline per cluster over the clients of that
cluster (robust rules and server optimisers apply per cluster, each with its own optimiser state
``<prefix>.<c>.<optimiser key>`` in the server state). The methods differ in how a client's cluster
is chosen (:meth:`ClusterModels.choose`) and in what the server does besides averaging.

Not a registered algorithm (the registry skips modules starting with ``_``).
"""

from __future__ import annotations

import torch

from hetfed.algorithms.fedavg import FedAvg, train_clients
from hetfed.engine.evaluate import ClientEvalData, Predictor
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
from hetfed.interface import server_step


class ClusterModels(FedAvg):
    """Cluster models under ``PREFIX``; subclasses say how a client's cluster is chosen."""

    #: the key prefix of the cluster models (the algorithm's name)
    PREFIX = ""
    #: how a client's cluster is chosen (why its model is not a function of its state alone)
    NO_SAVED_PREDICTION = ""

    def key(self, c: int, name: str) -> str:
        return f"{self.PREFIX}.{c}.{name}"

    def _names(self) -> list[str]:
        return [s.name for s in self.model.specs() if not s.local]

    def _model(self, params: Params, c: int) -> Params:
        return {n: params[self.key(c, n)] for n in self._names()}

    def _models(self, params: Params) -> list[Params]:
        count = len({k.split(".")[1] for k in params if k.startswith(self.PREFIX + ".")})
        return [self._model(params, c) for c in range(count)]

    @staticmethod
    def _gather(models: list[Params], chosen: torch.Tensor) -> Params:
        """Each client's cluster model, stacked (``models``: each cluster's, a row per client — its own run's)."""
        return {k: torch.stack([models[int(c)][k][i] for i, c in enumerate(chosen)]) for k in models[0]}

    def choose(self, bc: Broadcast, models: list[Params], local: Params, x: torch.Tensor, y: torch.Tensor,
               index: list, ids: list[int]) -> torch.Tensor:
        """Each client's cluster (``models``: each cluster's, a row per client; ``index``: its training data when
        training, its validation data when evaluated)."""
        raise NotImplementedError

    def upload_extra(self, chosen: torch.Tensor) -> dict[str, torch.Tensor]:
        """What a client uploads about its choice besides the models (IFCA: the cluster index)."""
        return {}

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        local, kept_opt = split_state(states)
        models = self._models(bc.stacked(n))
        chosen = self.choose(bc, models, local, data.x, data.y, data.indices, data.client_ids)
        params, opt_state, loss = train_clients(self, {**self._gather(models, chosen), **local}, kept_opt, data, bc.lr)
        mine = chosen.to(loss.device)
        upload = {}
        for c, model in enumerate(models):
            for name, received in model.items():
                picked = (mine == c).view(-1, *([1] * (received.dim() - 1)))
                upload[self.key(c, name)] = torch.where(picked, params[name], received)
        extra = {"train_loss": loss, **self.upload_extra(mine)}
        return (Upload(list(data.client_ids), upload, data.sizes(loss.device), extra),
                {**{k: params[k] for k in local}, **opt_state})

    def cluster_step(self, model: Params, upload: Upload, rows: torch.Tensor, source: int, target: int, rnd: int,
                     params: Params, extra: dict) -> None:
        """The server pipeline from ``model`` over the uploads' ``rows`` of cluster ``source``'s model; the result
        becomes cluster ``target``'s model in ``params`` and its optimiser state goes into ``extra``."""
        opt_key = self.context.pipeline.STATE
        sub = Upload([upload.client_ids[i] for i in rows.tolist()],
                     {k: upload.params[self.key(source, k)][rows.to(upload.params[self.key(source, k)].device)]
                      for k in model},
                     upload.num_samples[rows.to(upload.num_samples.device)])
        mine = ServerState(model, rnd, {opt_key: extra.get(self.key(target, opt_key), {})})
        new, new_extra = server_step(self, mine, sub)
        params.update({self.key(target, k): v for k, v in new.items()})
        if new_extra.get(opt_key):
            extra[self.key(target, opt_key)] = new_extra[opt_key]

    @torch.no_grad()
    def evaluate_server(self, state: ServerState, x_global: torch.Tensor, y_global: torch.Tensor) -> dict[str, float]:
        """No single global model: the global test set is scored by each client's cluster model."""
        return {}

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """Not from states alone: a client's model is its cluster's, chosen as it evaluates
        (:meth:`fitted_predictor`)."""
        raise ConfigError(f"{self.spec.name} has no client model without the client's data: {self.NO_SAVED_PREDICTION};"
                          " expected its evaluation (fitted_predictor, which hetfed.api's client predictions use)")

    @torch.no_grad()
    def fitted_predictor(self, bc: Broadcast, states: ClientState, data: ClientEvalData,
                         view: str | None = None) -> Predictor:
        """Each client's cluster's model, the cluster chosen on its validation rows."""
        local, _ = split_state(states)
        models = self._models(bc.stacked(len(data.client_ids)))
        chosen = self.choose(bc, models, local, data.x, data.y, data.val, data.client_ids)
        return Predictor(self.model, {**self._gather(models, chosen), **local}, True)
