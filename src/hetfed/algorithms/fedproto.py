"""FedProto (Tan et al. 2022, "FedProto: Federated Prototype Learning across Heterogeneous Clients", AAAI).

Clients share no model parameters, only *prototypes*: the mean representation of each class. Every client
keeps its whole model. Each round a client

1. trains its model on ``CE(h(z), y) + λ·‖z − C̄_y‖²/d`` per sample (``z`` the model's features before its
   head, ``d`` their width, ``C̄_y`` the global prototype of the sample's class; no term for a class without
   one — the first round has none), as PFLlib's ``clientproto`` computes the regulariser (a mean squared error,
   λ = 1 its default);
2. computes its prototypes with the trained model, ``C_k^j = mean of z over its training samples of class j``
   (the paper's Algorithm 1), and uploads them with its class counts.

The server's prototypes are the count-weighted means ``C̄^j = Σ_k n_{k,j} C_k^j / Σ_k n_{k,j}`` over the clients
that hold class ``j`` (PFLlib averages them unweighted); a class nobody has reported keeps its last prototype.
A client predicts the class whose global prototype is nearest its representation (squared distance, as
PFLlib's ``test_metrics``): the logits are ``−‖z − C̄_j‖²/d``, and a class without a prototype gets −10⁹. Every
client's model starts as the server's initial draw. The server holds no model (``unseen`` is empty).
"""

from __future__ import annotations

import torch
from pydantic import Field

from hetfed.algorithms._personal import body_of, initial_model
from hetfed.algorithms.fedavg import kept_optimizer_state, train_clients
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.evaluate import Predictor, predict
from hetfed.engine.local import StackObjective, client_mean, row_cross_entropy
from hetfed.engine.types import Broadcast, ClientData, ClientState, ServerState, Upload, index_on, split_state
from hetfed.errors import ConfigError
from hetfed.interface import Algorithm
from hetfed.models.base import Derived, Model, Noise, Params, Representation

#: a class without a prototype: its logit
FAR = -1e9
#: a client's rows of the global prototypes ``[C, d]`` and of which classes have one ``[C]``, where it classifies
PROTOTYPES, KNOWN = "fedproto.prototypes", "fedproto.known"


class FedProtoParams(AlgorithmParams):
    lam: float = Field(1.0, ge=0, description="λ, the weight of the prototype regulariser ‖z − C̄_y‖²/d "
                                              "(PFLlib's default 1.0)")


class NearestPrototype(Derived):
    """Logits ``−‖z − C̄_j‖²/d``: the class of the nearest global prototype wins. Each client's prototypes are
    rows of its parameters (``PROTOTYPES``, ``KNOWN``): the clients of a stacked sweep's stack hold their own run's."""

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        z = self.base.features(params, x, noise)  # [n, b, d]
        prototypes = params[PROTOTYPES].to(device=z.device, dtype=z.dtype)[:, None]  # [n, 1, C, d]
        distance = (z[..., None, :] - prototypes).pow(2).mean(-1)  # [n, b, C]
        known = params[KNOWN].to(z.device).bool()[:, None, :]
        return torch.where(known, -distance, torch.full_like(distance, FAR))


class FedProto(Algorithm):
    """Every client its own model; the server averages class prototypes, which regularise the clients."""

    def __init__(self, model, train, params=None, context=None):
        super().__init__(model, train, params, context)
        body_of(model, "fedproto")  # the prototypes live in the body's output: a model needs one

    def server_init(self, gen: torch.Generator) -> ServerState:
        c, d = self.model.n_classes, self.model.latent_dim
        return ServerState(params={}, extra={"prototypes": torch.zeros(c, d), "known": torch.zeros(c)})

    def broadcast(self, state: ServerState, round: int) -> Broadcast:
        bc = super().broadcast(state, round)  # no model parameters: the prototypes travel as the extra
        return Broadcast(bc.params, bc.round, bc.lr, {**bc.extra, **state.extra})

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        params = {**{k: v.clone() for k, v in initial_model(self).items()}, **self.model.init_local(gen)}
        return {**params, **kept_optimizer_state(self.train, params)}

    def _objective(self, bc: Broadcast, n: int, device: torch.device) -> StackObjective:
        return StackObjective(self._loss, {"prototypes": bc.extra_rows("prototypes", n).to(device),  # [n, C, d]
                                           "known": bc.extra_rows("known", n).to(device)})  # [n, C]

    def _loss(self, params: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, noise: Noise,
              inputs: Params) -> tuple[torch.Tensor, torch.Tensor]:
        """The cross-entropy plus λ · the features' distance to their class's global prototype (where the server
        knows one), which it descends; the cross-entropy, which it reports."""
        z = self.model.features(params, xb, noise)
        ce = row_cross_entropy(self.model.head(params, z), yb)
        regulariser = (z - at_labels(inputs["prototypes"], yb)).pow(2).mean(-1) * at_labels(inputs["known"], yb)
        return client_mean(ce + self.params.lam * regulariser, mask), client_mean(ce, mask)

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        params, kept_opt = split_state(states)
        params, opt_state, loss = train_clients(self, params, kept_opt, data, bc.lr,
                                                objective=self._objective(bc, len(data.client_ids), data.x.device))
        prototypes, counts = client_prototypes(self.model, params, data)
        upload = Upload(list(data.client_ids), {}, data.sizes(loss.device),
                        {"train_loss": loss, "prototypes": prototypes, "label_counts": counts})
        return upload, {**params, **opt_state}

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        counts = upload.extra["label_counts"].to(torch.float64)  # [m, C]
        total = counts.sum(0)
        summed = (upload.extra["prototypes"].to(torch.float64) * counts[..., None]).sum(0)  # [C, d]
        held = total > 0
        old = state.extra
        # the server's first prototypes are made on the host, the clients' on their device
        prototypes = torch.where(held[:, None], summed / total.clamp(min=1)[:, None],
                                 old["prototypes"].to(summed.device, torch.float64))
        known = torch.where(held, torch.ones_like(total), old["known"].to(total.device, torch.float64))
        return ServerState(params={}, round=state.round + 1,
                           extra={"prototypes": prototypes.float(), "known": known.float()})

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """Each client's representation against the global prototypes."""
        if not bc.has_extra("prototypes"):  # a saved run's model: its parameters only
            raise ConfigError("client predictions of this saved fedproto run are not possible: a client classifies "
                              "by the server's global prototypes, which runs written before hetfed saved them "
                              "beside the model (checkpoints/<model>-served.pt) lack; expected the run's metrics "
                              "(metrics.csv, summary.json) instead")
        params, _ = split_state(states)
        rows = {PROTOTYPES: bc.extra_rows("prototypes", n), KNOWN: bc.extra_rows("known", n)}
        return Predictor(NearestPrototype(self.model), {**params, **rows}, True)


def at_labels(table: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each client's row of its per-class ``table`` ``[n, C, …]`` at each of its ``labels`` ``[n, b]``: ``[n, b, …]``
    (a client's own run's prototypes or centroids, whatever run its stack's neighbours come from)."""
    return torch.take_along_dim(table, labels.reshape(*labels.shape, *[1] * (table.dim() - 2)), dim=1)


@torch.no_grad()
def client_prototypes(model: Model, params: Params, data: ClientData) -> tuple[torch.Tensor, torch.Tensor]:
    """Each client's mean representation per class ``[n, C, d]`` on its training data (no dropout) and its
    class counts ``[n, C]``."""
    counts = data.label_counts(model.n_classes)
    reps = predict(Representation(model), params, data.x, data.indices)
    out = torch.zeros(len(reps), model.n_classes, model.latent_dim, device=counts.device)
    for k, (z, index) in enumerate(zip(reps, data.indices, strict=True)):
        labels = data.y[index_on(index, data.y.device)].long()
        out[k].index_add_(0, labels, z.to(out.dtype))
    return out / counts.clamp(min=1)[..., None], counts


register(AlgorithmSpec(
    "fedproto", FedProto, "clients keep their models and share class prototypes (mean representations), which "
                          "regularise their training and classify by the nearest one",
    "Tan et al. 2022, FedProto: Federated Prototype Learning across Heterogeneous Clients", FedProtoParams,
    Capabilities(uploads="per-class prototypes (mean representations), class counts, sample count, training loss",
                 buffers="local",
                 whole_round=True, server_model=False, personalises=True, stacks_runs=True, compact_steps=True),
    privacy=(
        PrivacyRow(
            method="FedProto",
            config="`algorithm: fedproto`",
            params="nothing",
            extra="`train_loss`, `prototypes` (its mean representation per class), `label_counts`",
            stays="data; every model parameter; optimiser state when kept",
        ),
    ),
    family="prototype/contrastive", venue="AAAI 2022",
))
