"""Agnostic Federated Learning (Mohri, Sivek, Suresh 2019, "Agnostic Federated Learning", ICML).

AFL trains for the worst mixture of the clients' distributions rather than for their sample-weighted union: it
solves ``min_w max_{λ ∈ Δ} Σ_k λ_k F_k(w)`` (Δ the probability simplex over the clients, F_k client k's mean
training loss) by gradient descent on ``w`` and projected gradient ascent on ``λ``, and returns the average of its
iterates. It is the baseline q-FFL's paper (Li et al. 2020) compares against; hetfed's ``afl`` is another method
(Active FL), hence the name ``agnostic_fl``.

Each round, as the authors' code (``flearn/trainers/afl.py`` of q-FFL's repository, fair_flearn) does it:

    clients k of the round:  F_k(w_t) and their local update from w_t  (the authors: one full-batch gradient g_k)
    w_{t+1} = Σ_k λ_k w̄_k / Σ_k λ_k                                     (the authors: w_t − η Σ_k λ_k g_k)
    λ      ← Π_Δ(λ + γ_λ·F(w_t))                                       (F_k = 0 for a client not in the round)
    w̄^A   = (t·w̄^A + w_{t+1}) / (t + 1)                               (the model reported: the iterates' mean)

With one local step over all of a client's data (``train.local_steps: 1``, ``train.batch_size`` at least the
largest client's training set, ``train.client_fraction: 1``, plain SGD) a client's update is w_t − η g_k and
Σ_k λ_k = 1, so the step is the authors' exactly (tested); with hetfed's default schedule the clients take
FedAvg's local steps, as q-FedAvg does. Π_Δ is the Euclidean projection onto the simplex (the algorithm of Wang
and Carreira-Perpiñán 2013 that the authors' code cites). λ starts uniform (1/K each, K the federation's clients).

The model reported — scored on every client's and the global test set, chosen by validation, saved as the run's
model — is the mean of the iterates w_1 … w_t (``params.average``, the paper's w^A and the authors' evaluated
model; false: the last iterate), the server's extra ``average`` that ``Capabilities.reports`` names. The clients
evaluate it, so the broadcast carries it beside w_t: a client receives twice the model's bytes with ``average``
on. The weights λ_k stand in for the sample counts in the server chain's mean (a round whose clients all have
λ_k = 0 leaves the model where it was); a rule that weighs updates its own way (the median, Krum) ignores them,
as it ignores q-FedAvg's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch
from pydantic import Field

from hetfed.algorithms.qfedavg import ReportsStartLoss
from hetfed.algorithms.registry import AlgorithmParams, AlgorithmSpec, Capabilities, PrivacyRow, register
from hetfed.engine.types import Params, ServerState, Upload
from hetfed.interface import server_step

#: the server's extras: the mixture weights λ (float64, one per client) and the iterates' mean w̄^A
LAMBDAS, AVERAGE = "lambdas", "average"


class AgnosticFLParams(AlgorithmParams):
    lambda_lr: float = Field(0.01, gt=0, description="γ_λ, the step of λ's projected ascent on the clients' losses "
                                                     "(the authors' run.sh: 0.01)")
    average: bool = Field(True, description="report the mean of the iterates w_1…w_t (the paper's w^A, the "
                                            "authors' evaluated model); false: the last iterate")


def simplex_projection(v: torch.Tensor) -> torch.Tensor:
    """The Euclidean projection of ``v`` [K] onto the probability simplex: ``max(v − θ, 0)`` with the one θ that makes
    it sum to 1 (Wang and Carreira-Perpiñán 2013, Algorithm 1)."""
    u = torch.sort(v, descending=True).values
    shifted = (torch.cumsum(u, 0) - 1) / torch.arange(1, len(v) + 1, dtype=v.dtype)
    rho = int(torch.nonzero(u > shifted).max())  # the last place where u stays above the running threshold
    return (v - shifted[rho]).clamp_min(0)


class AgnosticFL(ReportsStartLoss):
    """Clients as q-FedAvg's (FedAvg's local work, F_k(w) reported); the server's minimax step (the module
    docstring)."""

    def server_init(self, gen: torch.Generator) -> ServerState:
        if not self._clients:
            raise RuntimeError("agnostic_fl: its λ holds one weight a client: bind() the federation before "
                               "server_init()")
        state = super().server_init(gen)
        k = self._clients
        extra = {**state.extra, LAMBDAS: torch.full((k,), 1.0 / k, dtype=torch.float64)}
        if self.params.average:
            extra[AVERAGE] = {name: v.clone() for name, v in state.params.items()}
        return ServerState(state.params, state.round, extra)

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        lambdas = state.extra[LAMBDAS]
        ids = torch.as_tensor(upload.client_ids, dtype=torch.long)
        weights = lambdas[ids]
        params, extra = state.params, dict(state.extra)
        if float(weights.sum()) > 0:  # 0 for an empty round too
            weighted = replace(upload, num_samples=weights.to(upload.num_samples.device))
            params, extra = server_step(self, state, weighted)
        ascent = lambdas.clone()
        if len(ids):
            ascent[ids] += self.params.lambda_lr * upload.extra["start_loss"].detach().double().cpu()
        extra[LAMBDAS] = simplex_projection(ascent)
        if self.params.average:
            extra[AVERAGE] = _running_mean(state.extra[AVERAGE], params, state.round)
        return ServerState(params, state.round + 1, extra)

    def findings(self, state: ServerState, upload: Upload) -> Mapping[str, float | torch.Tensor]:
        """Where λ stands after the round (:func:`lambda_findings`), and each client's λ_k (``lambda``)."""
        return {"lambda": state.extra[LAMBDAS], **lambda_findings(state.extra[LAMBDAS])}


def lambda_findings(lambdas: torch.Tensor) -> dict[str, float]:
    """Which clients the minimax weighs: ``lambda_max`` and ``lambda_min``, the largest and smallest λ_k;
    ``lambda_top_client``, the client with the largest (the lowest id on a tie); ``lambda_clients``, how many
    clients λ weighs in effect, 1/Σ_k λ_k² (K while λ is uniform, 1 once it rests on one client)."""
    return {"lambda_max": float(lambdas.max()), "lambda_min": float(lambdas.min()),
            "lambda_top_client": float(torch.argmax(lambdas)), "lambda_clients": float(1 / (lambdas**2).sum())}


def _running_mean(mean: Params, latest: Params, t: int) -> Params:
    """The mean of ``t`` iterates and ``latest``, as the authors' code updates it: ``(mean·t + latest) / (t + 1)``."""
    return {k: (v * t + latest[k]) / (t + 1) for k, v in mean.items()}


register(AlgorithmSpec(
    "agnostic_fl", AgnosticFL, "Agnostic FL: trains for the worst mixture of the clients' distributions "
    "(min over the model, max over client weights λ on the simplex); reports the mean of its iterates",
    "Mohri, Sivek, Suresh 2019, Agnostic Federated Learning", AgnosticFLParams,
    Capabilities(uploads="shared parameters, sample count, training loss, its loss F_k(w) before training",
                 whole_round=True, stacks_runs=True, reports=AVERAGE),
    privacy=(
        PrivacyRow(
            method="Agnostic FL",
            config="`algorithm: agnostic_fl`",
            params="shared model parameters",
            extra="`train_loss`; `start_loss`: its mean loss on its training data under the received model (one "
                  "number), which the server's λ ascends on",
            stays="data; optimiser state when kept",
        ),
    ),
    family="heterogeneity-specific", venue="ICML 2019",
))
