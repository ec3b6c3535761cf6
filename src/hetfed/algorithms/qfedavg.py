"""q-FedAvg (Li, Sanjabi, Beirami, Smith 2020, "Fair Resource Allocation in Federated Learning", Algorithm 2).

q-FFL minimises Σ_k p_k/(q + 1)·F_k^(q+1)(w): with q > 0 the clients with a higher loss weigh more, so the
accuracy across clients is more uniform (q = 0 is FedAvg's objective). q-FedAvg solves it with FedAvg's local
work and a server step whose size adapts to the clients' losses (L = 1/η, η the clients' learning rate):

    Δw_k = L·(w − w̄_k)                                 (w̄_k: client k's model after its local steps)
    Δ_k  = F_k^q(w)·Δw_k
    h_k  = q·F_k^(q−1)(w)·‖Δw_k‖² + L·F_k^q(w)
    w   ← w − Σ_k Δ_k / Σ_k h_k

where F_k(w) is client k's mean training loss under the model it received, before it trains, and the sums run
over the round's clients, which the paper samples in proportion to p_k = n_k/N. hetfed samples clients
uniformly, so by default (``params.weighting: samples``) it weighs each client's Δ_k and h_k by n_k in their
sums — the same objective Σ p_k·F_k^(q+1), and with q = 0 FedAvg's sample-weighted mean; ``weighting: uniform``
sums them unweighted, as Algorithm 2 and Flower's ``QFedAvg`` do with the clients they were given (tested
against Flower's class, driven with the same replies: each reply sent n_k times for ``samples``).

How hetfed computes it: a client trains as FedAvg's and uploads its model and F_k(w) (``extra["start_loss"]``,
one number; the paper's devices send Δ_k and h_k, which are functions of the same two). The server holds the
round's updates (``whole_round``: h_k reads each client's ‖Δw_k‖², which a running sum does not keep) and runs
its chain with each client weighted by a_k = F_k^q (in place of its sample count; times n_k by default) and the
pseudo-gradient scaled by s = L·Σ a_k / Σ h_k (≤ 1): w + s·(Σ a_k w̄_k / Σ a_k − w) = w − Σ Δ_k / Σ h_k, the
paper's step exactly with the default server (mean, ``sgd`` at lr 1); a server optimiser then steps on the
q-weighted pseudo-gradient, and a rule that weighs updates its own way (the median, Krum) ignores the q-weights.
F_k is taken + 1e-10 before its powers, as the authors' code and Flower's ``QFedAvg`` do; a client with no training
samples has F_k = 0.
η is the round's learning rate (``train.optimizer.lr`` decayed by ``train.lr_decay``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import torch
from pydantic import Field

from hetfed.algorithms.fedavg import FedAvg
from hetfed.algorithms.registry import AlgorithmParams, AlgorithmSpec, Capabilities, PrivacyRow, register
from hetfed.engine.evaluate import set_scores
from hetfed.engine.types import Broadcast, ClientData, ClientState, ServerState, Upload
from hetfed.interface import round_lr, server_step

#: what the authors' code and Flower's QFedAvg add to a loss before raising it to a power
EPS = 1e-10


class QFedAvgParams(AlgorithmParams):
    q: float = Field(0.1, ge=0, description="q, how much more a client with a higher loss weighs (0: FedAvg's "
                                            "objective; Flower's QFedAvg default 0.1)")
    weighting: Literal["samples", "uniform"] = Field(
        "samples", description="samples: Δ_k and h_k weighted by the client's sample count, the objective's p_k "
        "under uniform client sampling (q = 0: FedAvg); uniform: unweighted, as the paper's Algorithm 2 and "
        "Flower's QFedAvg sum the clients they sampled in proportion to p_k")


def start_losses(algo: FedAvg, bc: Broadcast, states: ClientState, data: ClientData) -> torch.Tensor:
    """Each stacked client's mean cross-entropy on its training samples under the received model (and its own
    local parameters), no dropout: F_k(w), float64 (0 for a client without samples)."""
    n = len(data.client_ids)
    local = {k: v for k, v in states.items() if k in algo.model.local_names}
    sums, _ = set_scores(algo.model, {**bc.stacked(n), **local}, data.x, data.y, [list(data.indices)])
    return torch.tensor([s / len(i) if len(i) else 0.0 for s, i in zip(sums, data.indices, strict=True)],
                        dtype=torch.float64)


def qffl_weights(upload: Upload, reference: dict[str, torch.Tensor], q: float, lipschitz: float,
                 by_samples: bool = True) -> tuple[torch.Tensor, float]:
    """Each client's weight a_k = p_k·(F_k + ε)^q and the scale s = L·Σ a_k / Σ p_k·h_k (the module docstring;
    ``by_samples``: p_k ∝ n_k, else 1), in float64, from the round's held updates and the model they started
    from."""
    loss = upload.extra["start_loss"].detach().double().cpu() + EPS
    p = upload.num_samples.detach().double().cpu() if by_samples else torch.ones_like(loss)
    a = p * loss.pow(q)
    # ‖w − w̄_k‖² where the updates are (a GPU's: only the n sums come back)
    moved = torch.zeros(len(loss), dtype=torch.float64)
    for k, v in upload.params.items():
        change = reference[k].detach().to(v.device).double().unsqueeze(0) - v.detach().double()
        moved += change.flatten(1).pow(2).sum(1).cpu()
    h = p * q * loss.pow(q - 1) * lipschitz**2 * moved + lipschitz * a
    return a, float(lipschitz * a.sum() / h.sum())


class ReportsStartLoss(FedAvg):
    """FedAvg's clients that also report F_k(w), their mean training loss under the model they received, before
    they train (``Upload.extra["start_loss"]``): what q-FFL's and Agnostic FL's servers weigh clients by."""

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        loss = start_losses(self, bc, states, data)
        upload, new = super().local_update(bc, states, data)
        extra = {**upload.extra, "start_loss": loss.to(upload.num_samples.device)}
        return replace(upload, extra=extra), new


class QFedAvg(ReportsStartLoss):
    """FedAvg's clients, reporting their loss before training; the q-FFL server step (the module docstring)."""

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        if not upload.client_ids:
            return ServerState(state.params, state.round + 1, state.extra)
        weights, scale = qffl_weights(upload, state.params, self.params.q, 1.0 / round_lr(self.train, state.round),
                                      self.params.weighting == "samples")
        weighted = replace(upload, num_samples=weights.to(upload.num_samples.device))
        params, extra = server_step(self, state, weighted, scale=scale)
        return ServerState(params, state.round + 1, extra)


register(AlgorithmSpec(
    "qfedavg", QFedAvg, "fair FedAvg (q-FFL): clients with a higher loss weigh more in the server's step, so "
    "accuracy is spread more evenly across clients",
    "Li et al. 2020, Fair Resource Allocation in Federated Learning", QFedAvgParams,
    Capabilities(uploads="shared parameters, sample count, training loss, its loss F_k(w) before training",
                 whole_round=True, stacks_runs=True),
    privacy=(
        PrivacyRow(
            method="q-FedAvg",
            config="`algorithm: qfedavg`",
            params="shared model parameters (every client of the round, held together: h_k reads each one's "
                   "change)",
            extra="`train_loss`; `start_loss`: its mean loss on its training data under the received model (one "
                  "number)",
            stays="data; optimiser state when kept",
        ),
    ),
    family="heterogeneity-specific", venue="ICLR 2020",
))
