"""Active Federated Learning (Goetz, Malik, Bui, Moon, Liu, Kumar 2019, "Active Federated Learning").

FedAvg whose server chooses the round's clients by a *valuation* each client
reports, instead of uniformly:

1. a sampled client computes its valuation under the model it receives, before
   training: its loss ``v_k = (1/√n_k) Σ_i ℓ(x_i, y_i)`` over its n_k training
   samples (the paper's loss valuation) — ``Upload.extra["valuation"]``;
2. the server keeps every client's latest valuation; clients not sampled keep
   their last one;
3. to sample m clients (the paper's Algorithm 1): the ``params.alpha1`` share of
   clients with the lowest valuations get probability 0; the others
   ``p_k ∝ exp(afl.alpha2 · v_k)``; ``(1 − afl.alpha3)·m`` clients are drawn from p
   without replacement, the remaining ``params.alpha3·m`` uniformly from the clients
   not yet chosen (α1 = 0.75, α2 = 0.01, α3 = 0.1 as in the paper).

Decision where the paper is silent: a client never valued yet counts with the
highest valuation known (0 before any), so every client is tried early (an
optimistic start); ties in the α1 cut are broken by a random order drawn from
the round's stream. The sampling is the algorithm's (:meth:`Afl.select_clients`);
the engine only asks for it — uniform sampling stays the default for every other
method.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from hetfed.algorithms.fedavg import FedAvg
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.evaluate import predict
from hetfed.engine.types import Broadcast, ClientData, ClientState, ServerState, Upload, index_on
from hetfed.models.base import Model

VALUATIONS = "valuations"


class AFLParams(AlgorithmParams):
    """Active Federated Learning's client sampling (Goetz et al. 2019, Algorithm 1; the paper's values)."""

    alpha1: float = Field(0.75, ge=0, lt=1, description="share of clients with the lowest valuations never drawn "
                          "by the softmax")
    alpha2: float = Field(0.01, ge=0, description="softmax inverse temperature on the valuations")
    alpha3: float = Field(0.1, ge=0, le=1, description="share of each round's clients drawn uniformly")


def loss_valuation(model: Model, params, data: ClientData) -> torch.Tensor:
    """Each stacked client's ``(1/√n) Σ loss`` of the received model on its training data (no dropout)."""
    logits = predict(model, params, data.x, data.indices)
    out = []
    for idx, lg in zip(data.indices, logits, strict=True):
        if len(idx) == 0:
            out.append(torch.tensor(0.0, device=data.x.device))
            continue
        y = data.y[index_on(idx, data.y.device)]
        out.append(F.cross_entropy(lg, y, reduction="sum") / math.sqrt(len(idx)))
    return torch.stack(out).double()


def afl_sample(valuations: np.ndarray, eligible: np.ndarray, m: int, cfg: AFLParams,
               rng: np.random.Generator) -> list[int]:
    """The paper's sampling: the lowest α1 share out, softmax(α2·v) for (1 − α3)·m, the rest uniform."""
    v = valuations[eligible].astype(np.float64)
    known = v[np.isfinite(v)]
    v = np.where(np.isfinite(v), v, known.max() if len(known) else 0.0)  # never valued: optimistic
    n = len(eligible)
    order = rng.permutation(n)  # random tie-break for the cut
    ranked = order[np.argsort(v[order], kind="stable")]
    cut = int(math.floor(cfg.alpha1 * n))
    keep = np.ones(n, dtype=bool)
    keep[ranked[:cut]] = False
    n_soft = min(int(math.ceil((1 - cfg.alpha3) * m)), int(keep.sum()))
    logits = cfg.alpha2 * v[keep]
    p = np.exp(logits - logits.max())
    p /= p.sum()
    soft = rng.choice(np.flatnonzero(keep), size=n_soft, replace=False, p=p) if n_soft else np.zeros(0, int)
    rest = np.setdiff1d(np.arange(n), soft)
    uniform = rng.choice(rest, size=m - n_soft, replace=False) if m > n_soft else np.zeros(0, int)
    return sorted(eligible[np.concatenate([soft, uniform]).astype(int)].tolist())


class Afl(FedAvg):
    """FedAvg with the server sampling clients by their reported loss valuations (see the module docstring)."""

    n_clients: int = 0

    def __init__(self, model: Model, train, params: AFLParams | None = None, context=None):
        super().__init__(model, train, params, context)
        self.cfg = self.params

    def bind(self, fed, seed: int = 0, per_round: int = 1) -> None:
        super().bind(fed, seed, per_round)
        self.n_clients = fed.n_clients

    def server_init(self, gen: torch.Generator) -> ServerState:
        state = super().server_init(gen)
        return ServerState(state.params, state.round,
                           {**state.extra, VALUATIONS: torch.full((self.n_clients,), float("nan"),
                                                                  dtype=torch.float64)})

    def select_clients(self, state: ServerState, eligible: np.ndarray, m: int, rng: np.random.Generator) -> list[int]:
        return afl_sample(state.extra[VALUATIONS].numpy(), eligible, m, self.cfg, rng)

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        received = bc.stacked(n)
        local = {k: v for k, v in states.items() if k in self.model.local_names}
        valuation = loss_valuation(self.model, {**received, **local}, data)
        upload, new = super().local_update(bc, states, data)
        return replace(upload, extra={**upload.extra, "valuation": valuation.to(upload.num_samples.device)}), new

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        new = super().aggregate(state, upload)
        values = state.extra.get(VALUATIONS, torch.zeros(0, dtype=torch.float64)).clone()
        ids = torch.as_tensor(upload.client_ids, dtype=torch.long)
        if len(ids) and int(ids.max()) >= len(values):  # server_init before bind (a bare algorithm object)
            values = torch.cat([values, torch.full((int(ids.max()) + 1 - len(values),), float("nan"),
                                                   dtype=torch.float64)])
        if len(ids):
            values[ids] = upload.extra["valuation"].detach().double().cpu()
        return ServerState(new.params, new.round, {**new.extra, VALUATIONS: values})


register(AlgorithmSpec(
    "afl", Afl, "FedAvg whose server samples clients by the loss valuations they report",
    "Goetz et al. 2019, Active Federated Learning", AFLParams,
    Capabilities(uploads="shared parameters, sample count, training loss, the loss valuation v_k",
                 stacks_runs=True),
    legacy_section="afl",
    privacy=(
        PrivacyRow(
            method="AFL",
            config="`algorithm: afl`",
            params="shared model parameters",
            extra="`train_loss`; `valuation`: its loss under the received model, (1/√n_k)·Σ loss over its training "
                  "data (one number)",
            stays="data; optimiser state when kept",
        ),
    ),
    family="global", venue="arXiv 2019",
))
