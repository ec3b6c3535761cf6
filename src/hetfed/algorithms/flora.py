"""FLoRA (Wang et al., "FLoRA: Federated Fine-Tuning Large Language Models with Heterogeneous Low-Rank Adaptations",
NeurIPS 2024).

Averaging the A and B matrices of LoRA adapters separately is not averaging their updates: the mean of B_k A_k is not
(mean B)(mean A). FLoRA aggregates by **stacking**: the server concatenates the clients' A matrices (scaled by their
weights p_k) and B matrices along the rank axis, whose product is exactly Σ_k p_k B_k A_k, whatever each client's
rank. Clients merge that update into the layer's weight and start new adapters for the next round.

Here the merged update is kept beside the frozen base — one ``[out, in]`` matrix per adapted layer, ``W`` — and each
adapted layer computes ``W₀x + W x + (α/r) B A x``. Each round: a client trains fresh adapters (the server's new
draw of A, B zero — one draw for all; the paper lets each client draw its own) and the head, the merged W held
fixed, and uploads its adapters and head; the server adds ``(α/r)·Σ_k p_k B_k A_k`` to W (p_k: sample weights), sends
a fresh A and a zero B, and averages the head through the server chain. The clients may train ranks of their own
(``params.ranks``, or drawn from ``min_rank … model.rank``): stacking is exact for any mix of ranks. What a client
receives is counted as W itself (dense), what it sends as its adapters and head: the paper's server sends the stacked
modules instead (Σ_k r_k·(in + out) per layer), which is less than W when that sum is below in·out.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from hetfed.algorithms.build import METHOD_KEY
from hetfed.algorithms.fedavg import FedAvg, train_clients
from hetfed.algorithms.hetlora import ClientRanks, RanksParams
from hetfed.algorithms.registry import AlgorithmSpec, Capabilities, PrivacyRow, register
from hetfed.engine.evaluate import Predictor
from hetfed.engine.rng import SERVER_ROUND, torch_gen
from hetfed.engine.types import Broadcast, ClientData, ClientState, Params, ServerState, Upload
from hetfed.errors import ConfigError
from hetfed.interface import own_parameters, server_step
from hetfed.server.chain import Combine, Optimize, Rescale

#: the server state's extra holding the merged update of every adapted layer (sent to the clients with the round)
MERGED = "flora.merged"


def _plain(step: Any) -> bool:
    """A chain step that leaves the sample-weighted mean as it is (the one FLoRA's stacking stands in for)."""
    if isinstance(step, Combine):
        return step.rule.name == "mean"
    if isinstance(step, Optimize):
        return step.optimizer.name == "sgd" and step.optimizer.lr == 1.0
    return isinstance(step, Rescale)  # FedNova's scale only: 1 here


class FLoRA(ClientRanks):
    """Adapters aggregated by stacking (the exact Σ_k p_k B_k A_k), merged into the layers' weights each round."""

    def bind(self, fed, seed: int = 0, per_round: int = 1) -> None:
        super().bind(fed, seed, per_round)
        chain = self.context.pipeline
        if chain is not None and not all(_plain(step) for step in chain.steps):
            stages = chain.stages()
            raise ConfigError(f"{METHOD_KEY}algorithm = 'flora' is not allowed with the server chain {list(stages)}: "
                              "FLoRA stacks the clients' adapters (a weighted sum of their products); expected the "
                              "default server (server.combine.rule 'mean', server.optimizer sgd at lr 1, no DP)")

    def server_init(self, gen: torch.Generator) -> ServerState:
        state = super().server_init(gen)
        merged = {w: torch.zeros(shape) for w, shape in zip(self._names("W"), self._shapes(), strict=True)}
        return ServerState(state.params, state.round, {**state.extra, MERGED: merged})

    def _names(self, matrix: str) -> tuple[str, ...]:
        return self.model.lora_names(matrix)  # type: ignore[attr-defined]  # a lora_encoder (Capabilities)

    def _shapes(self) -> list[tuple[int, int]]:
        return self.model.adapted_shapes()  # type: ignore[attr-defined]

    def broadcast(self, state: ServerState, round: int) -> Broadcast:
        return replace(super().broadcast(state, round), extra=dict(state.extra[MERGED]))

    def _with_merged(self, params: Params, bc: Broadcast, n: int) -> Params:
        """The clients' parameters with each adapted layer's merged update as their rows (``bc.extra_rows``: views of
        one matrix for a run's clients; in a stacked sweep's joined stack, each client's own run's)."""
        return {**params, **{w: bc.extra_rows(w, n) for w in self._names("W")}}

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        start, kept_opt, ranks = self._cut(bc, states, n)
        params, opt_state, loss = train_clients(self, self._with_merged(start, bc, n), kept_opt, data, bc.lr,
                                                trainable=list(start))  # the merged update held fixed
        return Upload.of(data, params, bc.params, loss), self._kept(bc, start, params, opt_state, ranks)

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        params, _opt, _ranks = self._cut(bc, states, n)
        return Predictor(self.model, self._with_merged(params, bc, n), own_parameters(self))

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        """W += (α/r)·Σ_k p_k B_k A_k (the stacked adapters' product), the head through the chain, and new adapters
        for the next round: A a fresh draw, B zero."""
        params, extra = server_step(self, state, upload)
        merged = dict(state.extra[MERGED])
        if upload.client_ids:
            weights = upload.num_samples.double() / upload.num_samples.double().sum()
            scaling = self.model.scaling  # type: ignore[attr-defined]
            for a, b, w in zip(self._names("A"), self._names("B"), self._names("W"), strict=True):
                update = torch.einsum("k,kor,kri->oi", weights.to(upload.params[a]), upload.params[b],
                                      upload.params[a])
                merged[w] = merged[w] + scaling * update.to(merged[w])
        fresh = self.model.init_shared(torch_gen(self._seed, SERVER_ROUND, state.round + 1))
        for name in (*self._names("A"), *self._names("B")):
            params[name] = fresh[name].to(params[name])
        return ServerState(params, state.round + 1, {**extra, MERGED: merged})

    def reported_state(self, state: ServerState) -> ServerState:
        """The server's model: the base, the merged update and the head (its fresh adapters add nothing: B is 0);
        what it scores and a run saves."""
        return ServerState({**state.params, **state.extra.get(MERGED, {})}, state.round)

    @torch.no_grad()
    def evaluate_server(self, state: ServerState, x_global: torch.Tensor, y_global: torch.Tensor) -> dict[str, Any]:
        """:meth:`reported_state`'s model, scored alone: its merged updates are names FedIT's model lacks, so a
        stacked sweep does not score it in one forward with theirs (:func:`hetfed.interface.evaluate_servers`)."""
        return FedAvg.evaluate_server(self, state, x_global, y_global)


register(AlgorithmSpec(
    "flora", FLoRA, "LoRA adapters (of any ranks) aggregated by stacking — the exact weighted sum of the clients' "
    "B A — and merged into the layers' weights each round", "Wang et al. 2024, FLoRA: Federated Fine-Tuning Large "
    "Language Models with Heterogeneous Low-Rank Adaptations", RanksParams,
    Capabilities(uploads="every adapter's A and B (zero beyond the client's rank) and the head, sample count, "
                 "training loss", whole_round=True, stacks_runs=True, model_kinds=("lora_encoder",),
                 model_reason="it stacks LoRA adapters: use model.kind lora_encoder with embed.kind wordpiece"),
    model={"kind": "lora_encoder"},
    privacy=(
        PrivacyRow(
            method="FLoRA",
            config="`algorithm: flora` + `model.kind: lora_encoder`",
            params="every adapter's A and B up to the client's rank, the head",
            extra="`train_loss`",
            stays="data; its rank; the frozen encoder (never sent); optimiser state when kept",
        ),
    ),
    family="global", venue="NeurIPS 2024",
))
