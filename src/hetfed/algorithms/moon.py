"""MOON (Li, He, Song 2021, "Model-Contrastive Federated Learning", CVPR).

A client corrects its local drift by pulling the representation its model gives an input towards the one
the received global model gives it, and away from the one its own model of the previous round gave it. With
``z = R_w(x)``, ``z_glob = R_{w^t}(x)`` (the received model, frozen) and ``z_prev = R_{w_k^{t−1}}(x)`` (the
client's model after its last local training, frozen), each sample adds the paper's model-contrastive loss

    ℓ_con = −log( exp(sim(z, z_glob)/τ) / (exp(sim(z, z_glob)/τ) + exp(sim(z, z_prev)/τ)) )

with ``sim`` the cosine similarity, to its cross-entropy: ``ℓ = ℓ_sup + μ·ℓ_con``. The representation is the
model's features before its classifier head (``Model.features``: the paper's projection head's output). The
defaults are the paper's: τ = 0.5, μ = 1 (its CIFAR-100 and Tiny-ImageNet value; 5 on CIFAR-10). Every client's
previous model starts as the server's initial model (the authors' code), so at its first round ``z_prev`` is
``z_glob``'s round-0 value. The frozen models run without dropout. The server averages as FedAvg.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from hetfed.algorithms._personal import body_of, initial_model
from hetfed.algorithms.fedavg import FedAvg, train_clients
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.local import StackObjective, client_mean, row_cross_entropy
from hetfed.engine.types import Broadcast, ClientData, ClientState, Upload, split_state
from hetfed.models.base import Noise, Params, prefixed, under, without

#: the client's previous local model in its state
PREVIOUS = "moon.prev."


class MOONParams(AlgorithmParams):
    mu: float = Field(1.0, ge=0, description="μ, the weight of the model-contrastive loss (paper: 5 on CIFAR-10, "
                                             "1 on CIFAR-100 and Tiny-ImageNet)")
    tau: float = Field(0.5, gt=0, description="τ, the temperature of the contrastive loss (paper: 0.5)")


def contrastive_loss(z: torch.Tensor, z_glob: torch.Tensor, z_prev: torch.Tensor, tau: float) -> torch.Tensor:
    """ℓ_con per row ``[n, batch]`` of stacked representations ``[n, batch, d]``."""
    positive = F.cosine_similarity(z, z_glob, dim=-1) / tau
    negative = F.cosine_similarity(z, z_prev, dim=-1) / tau
    return torch.logsumexp(torch.stack([positive, negative]), 0) - positive


GLOBAL, PREV = "global.", "previous."  # the frozen models' parameters among a MOON step's declared inputs


class MOON(FedAvg):
    """FedAvg whose clients add the model-contrastive loss towards the global model's representation."""

    def __init__(self, model, train, params=None, context=None):
        super().__init__(model, train, params, context)
        body_of(model, "moon")  # the representation is the body's output: refused for a model without one

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        state = super().client_init(client_id, gen)
        return {**state, **{PREVIOUS + k: v.clone() for k, v in initial_model(self).items()}}

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        prev = under(states, PREVIOUS)
        local, kept_opt = split_state(without(states, PREVIOUS))
        glob = bc.stacked(n)
        objective = StackObjective(self._loss, {**prefixed(glob, GLOBAL), **prefixed(prev, PREV)})
        params, opt_state, loss = train_clients(self, {**glob, **local}, kept_opt, data, bc.lr, objective=objective)
        upload = Upload.of(data, params, bc.params, loss)
        return upload, {**{k: params[k] for k in local}, **opt_state,
                        **{PREVIOUS + k: params[k] for k in prev}}

    def _loss(self, params: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, noise: Noise,
              inputs: Params) -> tuple[torch.Tensor, torch.Tensor]:
        """ℓ_sup + μ·ℓ_con per client (mean over its real rows), reporting ℓ_sup; ``inputs``: the frozen global and
        previous models' shared parameters (``global.<name>``, ``previous.<name>``), stacked [n, ...]."""
        model = self.model
        glob = under(inputs, GLOBAL)
        prev = under(inputs, PREV)
        z = model.features(params, xb, noise)
        ce = row_cross_entropy(model.head(params, z), yb)
        with torch.no_grad():  # the global and previous models are frozen; the client's own rows (CGAU) are kept
            own = {k: v.detach() for k, v in params.items()}
            z_glob = model.features({**own, **glob}, xb, None)
            z_prev = model.features({**own, **prev}, xb, None)
        contrastive = contrastive_loss(z, z_glob, z_prev, self.params.tau)
        return client_mean(ce + self.params.mu * contrastive, mask), client_mean(ce, mask)


register(AlgorithmSpec(
    "moon", MOON, "FedAvg plus a contrastive loss pulling the local representation towards the global model's "
                  "and away from the client's previous model's",
    "Li, He, Song 2021, Model-Contrastive Federated Learning", MOONParams,
    Capabilities(stacks_runs=True, private=True, compact_steps=True),
    privacy=(
        PrivacyRow(
            method="MOON",
            config="`algorithm: moon`",
            params="shared model parameters",
            extra="`train_loss` (its mean cross-entropy)",
            stays="data; its previous local model (`moon.prev.<name>`); optimiser state when kept",
        ),
    ),
    family="prototype/contrastive", venue="CVPR 2021",
))
