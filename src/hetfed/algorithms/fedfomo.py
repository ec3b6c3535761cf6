"""FedFomo (Zhang, Sapra, Fidler, Yeung, Alvarez 2021, "Personalized Federated Learning with First Order Model
Optimization", ICLR), as PFLlib's ``clientfomo`` / ``serverfomo``.

There is no global model. The server keeps every client's latest model θ_j (all start from one draw) and an
affinity matrix P (N × N, the identity at first). Each round it sends client i the M models with the highest
``P[i]`` (``params.models``, PFLlib's default 5; fewer while fewer clients than M have uploaded: none before the
first upload) and the client's own latest model θ_i. The client holds out the last ``params.val_share`` (0.2,
PFLlib's) of its training samples and weighs each received model by how much it improves on its own there, per
unit of distance (the paper's first-order estimate, its Eq. 5):

    w_n = (L_i(θ_i) − L_i(θ_n)) / (‖θ_n − θ_i‖₂ + 1e-5),

L_i the mean cross-entropy on the held-out samples. With ``w⁺ = max(w, 0)``, it starts from
``Σ_n w⁺_n θ_n / Σ_n w⁺_n`` — the paper's ``θ_i + Σ_n (w⁺_n/Σw⁺)(θ_n − θ_i)`` — or from θ_i when no model helps,
trains on the rest of its samples and uploads the trained model with its weights w. The server stores the model
as θ_i and adds w to ``P[i]`` at the senders' positions.

Differences from PFLlib: L_i is the mean over the held-out samples (PFLlib averages batch means: the same when
they fit one batch) and θ_i is the client's latest trained model (PFLlib's weights compare with the model it
*started* its previous round from, an ``old_model`` copied before training). A client with fewer than 5 samples
holds none out (PFLlib's split would leave it no training data) and keeps its own model.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
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
from hetfed.engine.evaluate import Predictor, client_losses
from hetfed.engine.types import Broadcast, ClientData, ClientState, Params, ServerState, Upload, split_state
from hetfed.models.base import prefixed

#: personal rows: the client's own latest model ``fomo.own.<name>``, the candidates ``fomo.cand.<name>`` [M, …]
OWN, CANDIDATE, SENDERS = "fomo.own.", "fomo.cand.", "fomo.senders"


class FedFomoParams(AlgorithmParams):
    models: int = Field(5, ge=1, description="M, the models each client receives (PFLlib's --M, default 5)")
    val_share: float = Field(0.2, gt=0, lt=1, description="the share of its training samples a client holds out "
                                                          "to weigh the models it receives (PFLlib's 0.2)")


def fomo_weights(own_loss: torch.Tensor, losses: torch.Tensor, own: Params, candidates: Params) -> torch.Tensor:
    """``w_n = (L(θ_i) − L(θ_n)) / (‖θ_n − θ_i‖ + 1e-5)`` [n, M] (``own`` [n, …], ``candidates`` [n, M, …])."""
    squared = sum(((candidates[k] - own[k].unsqueeze(1)) ** 2).flatten(2).sum(-1) for k in own)
    return (own_loss.unsqueeze(1) - losses) / (torch.as_tensor(squared).sqrt() + 1e-5)


def combined(own: Params, candidates: Params, weights: torch.Tensor) -> Params:
    """``Σ w⁺_n θ_n / Σ w⁺`` per client, or its own model where no weight is positive."""
    positive = weights.clamp(min=0)
    total = positive.sum(1)
    share = positive / total.clamp(min=1e-30).unsqueeze(1)
    out = {}
    for k, v in own.items():
        mix = (share.view(*share.shape, *([1] * (v.dim() - 1))).to(v) * candidates[k]).sum(1)
        out[k] = torch.where((total > 0).view(-1, *([1] * (v.dim() - 1))), mix, v)
    return out


class FedFomo(FedAvg):
    """Each client combines the models that beat its own on its held-out data, weighted by their gain."""


    def _names(self) -> list[str]:
        return [s.name for s in self.model.specs() if not s.local]

    def server_init(self, gen: torch.Generator) -> ServerState:
        return ServerState({}, 0, {"first": self.model.init_shared(gen), "uploaded": 0})

    def _table(self, state: ServerState) -> tuple[Params, torch.Tensor]:
        """Every client's latest model [N, …] and the affinities P [N, N] (every client at the first draw, P = I)."""
        if "models" in state.extra:
            return state.extra["models"], state.extra["affinity"]
        n = self._clients
        first = state.extra["first"]
        return ({k: v.unsqueeze(0).repeat(n, *([1] * v.dim())) for k, v in first.items()},
                torch.eye(n, dtype=torch.float64))

    def broadcast(self, state: ServerState, round: int) -> Broadcast:
        bc = super().broadcast(state, round)
        models, affinity = self._table(state)
        m = min(self.params.models, int(state.extra.get("uploaded", 0)), self._clients)
        senders = affinity.topk(m, dim=1).indices if m else torch.zeros(self._clients, 0, dtype=torch.long)
        personal = {**prefixed(models, OWN),
                    **{CANDIDATE + k: v[senders] for k, v in models.items()}, SENDERS: senders.to(torch.float32)}
        return Broadcast({}, bc.round, bc.lr, bc.extra, personal=personal)

    def predicting(self, bc: Broadcast) -> Broadcast:
        """Each client's own model alone (its candidates, M models a client, are what it trains with)."""
        return replace(bc, personal={k: v for k, v in bc.personal.items() if k.startswith(OWN)})

    @staticmethod
    def _held_out(data: ClientData, share: float) -> tuple[ClientData, list[np.ndarray]]:
        """(the training data without each client's last ``share`` of samples, those samples)."""
        cut = [int(share * len(i)) if len(i) >= 5 else 0 for i in data.indices]
        train = [i[: len(i) - c] for i, c in zip(data.indices, cut, strict=True)]
        held = [i[len(i) - c:] for i, c in zip(data.indices, cut, strict=True)]
        return replace(data, indices=train), held

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        local, kept_opt = split_state(states)
        names = self._names()
        own = {k: bc.personal[OWN + k] for k in names}
        candidates = {k: bc.personal[CANDIDATE + k] for k in names}
        m = bc.personal[SENDERS].shape[1]
        train, held = self._held_out(data, self.params.val_share)
        weights = torch.zeros(n, m)
        if m:
            own_loss = client_losses(self.model, {**own, **local}, data.x, data.y, held).cpu()
            losses = torch.stack([client_losses(self.model, {**{k: v[:, j] for k, v in candidates.items()}, **local},
                                                data.x, data.y, held).cpu() for j in range(m)], dim=1)
            weights = fomo_weights(own_loss, losses, {k: v.cpu() for k, v in own.items()},
                                   {k: v.cpu() for k, v in candidates.items()})
            weights[torch.tensor([len(h) == 0 for h in held])] = 0.0  # nothing held out: its own model
        start = combined(own, candidates, weights.to(next(iter(own.values())).device)) if m else own
        params, opt_state, loss = train_clients(self, {**start, **local}, kept_opt, train, bc.lr)
        upload = Upload(list(data.client_ids), {k: params[k] for k in names}, train.sizes(loss.device),
                        {"train_loss": loss, "fomo_weights": weights.to(loss.device),
                         "fomo_senders": bc.personal[SENDERS].to(loss.device)})
        return upload, {**{k: params[k] for k in local}, **opt_state}

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        models, affinity = self._table(state)
        models, affinity = {k: v.clone() for k, v in models.items()}, affinity.clone()
        if upload.client_ids:
            ids = torch.as_tensor(upload.client_ids, dtype=torch.long)
            for k, v in models.items():
                v[ids] = upload.params[k].detach().cpu().to(v.dtype)
            senders = upload.extra["fomo_senders"].long().cpu()
            weights = upload.extra["fomo_weights"].cpu().to(torch.float64)
            for row, cid in enumerate(upload.client_ids):  # P[i] += w at the senders' positions
                affinity[cid].index_add_(0, senders[row], weights[row])
        extra = {**state.extra, "models": models, "affinity": affinity, "uploaded": len(upload.client_ids)}
        return ServerState({}, state.round + 1, extra)

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """Each client predicts with its own latest model."""
        local, _ = split_state(states)
        return Predictor(self.model, {**{k: bc.personal[OWN + k] for k in self._names()}, **local}, True)


register(AlgorithmSpec(
    "fedfomo", FedFomo, "no global model: each client combines the models of other clients that lower its own "
                        "held-out loss, weighted by gain per distance",
    "Zhang et al. 2021, Personalized Federated Learning with First Order Model Optimization", FedFomoParams,
    Capabilities(uploads="its trained model, sample count, training loss, the weights it gave the models it "
                         "received", whole_round=True, server_model=False, personalises=True, per_client=True,
                 stacks_runs=True),
    privacy=(
        PrivacyRow(
            method="FedFomo",
            config="`algorithm: fedfomo`",
            params="its whole trained model (the server forwards it to other clients)",
            extra="`train_loss`, `fomo_weights` (its weight for each model it received), `fomo_senders`",
            stays="data, its held-out samples' losses; optimiser state when kept",
        ),
    ),
    family="personalised", venue="ICLR 2021",
))
