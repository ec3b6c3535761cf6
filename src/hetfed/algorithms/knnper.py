"""kNN-Per (Marfoq, Neglia, Vidal, Kameni 2022, "Personalized Federated Learning through Local Memorization",
ICML).

FedAvg trains the global model; each client personalises it at prediction time with a memory of its own data. A
client keeps a datastore of its training samples' representations under the global model, ``(φ(x_i), y_i)``,
and predicts the paper's mixture

    p(y | x) = λ·p_kNN(y | x) + (1 − λ)·p_model(y | x),
    p_kNN(y | x) = Σ_{i ∈ N_k(x)} 1[y_i = y]·exp(−‖φ(x) − φ(x_i)‖² / (d·s)) / Σ_{i ∈ N_k(x)} exp(−‖φ(x) − φ(x_i)‖² /
    (d·s))

over its ``k`` nearest neighbours ``N_k(x)``, ``d`` the representation's width and ``s`` the scale. Defaults are
FL-bench's (``k`` = 5, λ = 0.5, ``s`` = 1, at most 500 samples in a datastore, drawn from the client's training
data with a stream of its own when it holds more). FL-bench mixes the kNN probabilities with the model's raw
logits; here both are probabilities, as the paper writes, and the prediction's "logits" are the mixture's log.
Training is FedAvg's; the datastore is rebuilt at every evaluation, from the global model the client holds then.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field

from hetfed.algorithms._personal import body_of
from hetfed.algorithms.fedavg import FedAvg
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.evaluate import ClientEvalData, Predictor, predict
from hetfed.engine.rng import DATASTORE, derive_seed
from hetfed.engine.types import Broadcast, ClientState, index_on, split_state
from hetfed.models.base import Derived, Model, Noise, Params, Representation

KEYS, LABELS = "knn.keys", "knn.labels"


class KNNPerParams(AlgorithmParams):
    k: int = Field(5, ge=1, description="neighbours in the client's datastore (FL-bench's default)")
    weight: float = Field(0.5, ge=0, le=1, description="λ, the kNN distribution's weight in the mixture")
    scale: float = Field(1.0, gt=0, description="s: similarities exp(−‖φ(x) − φ(x_i)‖² / (d·s))")
    capacity: int = Field(500, ge=1, description="at most this many training samples in a client's datastore")


class NearestNeighbours(Derived):
    """The model mixed with each client's kNN distribution over its datastore (``knn.keys``, ``knn.labels``)."""

    def __init__(self, base: Model, k: int, weight: float, scale: float):
        super().__init__(base)
        self.k, self.weight, self.scale = k, weight, scale

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        z = self.base.features(params, x, None)  # [n, b, d]
        model = torch.softmax(self.base.head(params, z), -1)
        keys, labels = params[KEYS].to(z.dtype), params[LABELS]  # [n, cap, d], [n, cap] (−1: empty slot)
        distance = torch.cdist(z, keys).pow(2)  # [n, b, cap]
        distance = distance.masked_fill((labels < 0)[:, None, :], float("inf"))
        k = min(self.k, keys.shape[1])
        near, at = (-distance).topk(k, dim=-1)  # the k nearest: −distance, positions [n, b, k]
        similarity = torch.exp(near / (z.shape[-1] * self.scale))  # exp(−d²/(d·s)); 0 at an empty slot
        neighbour = labels.gather(1, at.flatten(1)).view(at.shape)  # [n, b, k]
        votes = torch.zeros_like(model).scatter_add_(-1, neighbour.clamp(min=0), similarity)
        knn = votes / (similarity.sum(-1, keepdim=True) + 1e-9)
        return torch.log((self.weight * knn + (1 - self.weight) * model).clamp(min=1e-12))


class KNNPer(FedAvg):
    """FedAvg; each client predicts with the global model mixed with a kNN over its own training data."""

    def __init__(self, model, train, params=None, context=None):
        super().__init__(model, train, params, context)
        body_of(model, "knnper")  # the datastore holds the body's representations

    def datastores(self, params: Params, data: ClientEvalData) -> tuple[torch.Tensor, torch.Tensor]:
        """Each client's datastore under ``params``: keys ``[n, capacity, d]`` and labels ``[n, capacity]`` (−1 where
        a client holds fewer samples)."""
        assert data.train is not None
        cap = self.params.capacity
        kept = [idx if len(idx) <= cap else np.sort(np.random.default_rng(derive_seed(self.context.seed, DATASTORE, c))
                                                      .choice(idx, cap, replace=False))
                for c, idx in zip(data.client_ids, data.train, strict=True)]
        reps = predict(Representation(self.model), params, data.x, kept)
        n, width = len(kept), max((len(i) for i in kept), default=0)
        keys = torch.zeros(n, max(width, 1), self.model.latent_dim, device=data.x.device)
        labels = torch.full((n, max(width, 1)), -1, dtype=torch.long, device=data.x.device)
        for j, (z, idx) in enumerate(zip(reps, kept, strict=True)):
            keys[j, :len(idx)] = z.to(keys.dtype)
            labels[j, :len(idx)] = data.y[index_on(idx, data.y.device)].long()
        return keys, labels

    def fitted_predictor(self, bc: Broadcast, states: ClientState, data: ClientEvalData,
                         view: str | None = None) -> Predictor:
        """The global model mixed with each client's neighbours in a datastore of its training representations;
        without its training rows, the global model alone."""
        n = len(data.client_ids)
        if data.train is None:
            return self.predictor(bc, states, n, view)
        local, _ = split_state(states)
        params = {**bc.stacked(n), **local}
        keys, labels = self.datastores(params, data)
        mixed = NearestNeighbours(self.model, self.params.k, self.params.weight, self.params.scale)
        return Predictor(mixed, {**params, KEYS: keys, LABELS: labels}, True)


register(AlgorithmSpec(
    "knnper", KNNPer, "FedAvg's global model mixed, on each client, with a k-nearest-neighbour distribution over a "
                      "datastore of its own training representations",
    "Marfoq, Neglia, Vidal, Kameni 2022, Personalized Federated Learning through Local Memorization", KNNPerParams,
    Capabilities(private=True, personalises=True, stacks_runs=True, plain_steps=True),
    privacy=(
        PrivacyRow(
            method="kNN-Per",
            config="`algorithm: knnper`",
            params="shared model parameters",
            extra="`train_loss`",
            stays="data; its datastore of representations (rebuilt at every evaluation)",
        ),
    ),
    family="personalised", venue="ICML 2022",
))
