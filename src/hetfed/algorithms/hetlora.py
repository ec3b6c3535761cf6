"""HetLoRA (Cho et al., "Heterogeneous LoRA for Federated Fine-tuning of On-Device Foundation Models", EMNLP 2024).

Clients of different capacities train LoRA adapters of different ranks over one frozen encoder (system
heterogeneity). The server holds adapters of the model's rank ``r`` (``model.rank``, the largest); client k trains
their first ``r_k`` rank components: the broadcast truncated to ``A[:r_k]``, ``B[:, :r_k]``, the rest zero. A
component whose A row and B column are both zero gets no gradient, so the truncated part stays zero through any
optimiser and the client's upload is its rank-``r_k`` adapters zero-padded to ``r`` (what the paper's server pads).

* **Self-pruning.** A client adds ``λ·‖A[⌊γr_k⌋:r_k]‖·‖B[:, ⌊γr_k⌋:r_k]‖`` per adapter to its loss, pushing its
  last components to zero; when that term is smaller after its local training than on the adapters it received,
  it prunes its rank to ``max(min_rank, ⌊γ·r_k⌋)`` for its next rounds (the rank is client state, never sent).
* **Sparsity-weighted aggregation.** The server averages the zero-padded adapters (and the head) with weights
  ``p_k ∝ Σ_layers ‖B_k A_k‖_F`` instead of sample counts: an update that moved the model more counts more. One
  weight per client for all its adapters (the paper's ΔW_k is the client's whole LoRA update).

Initial ranks: ``params.ranks`` (one per client) or drawn uniformly from ``min_rank … model.rank`` from each
client's own stream. What the run reports as uplink bytes is the padded rank-``r`` upload, an upper bound of what
a client of rank ``r_k`` must send (``r_k / r`` of its adapters).
"""

from __future__ import annotations

import torch
from pydantic import Field

from hetfed.algorithms.build import METHOD_KEY
from hetfed.algorithms.fedavg import FedAvg, train_clients
from hetfed.algorithms.registry import AlgorithmParams, AlgorithmSpec, Capabilities, PrivacyRow, register
from hetfed.engine.evaluate import Predictor
from hetfed.engine.types import Broadcast, ClientData, ClientState, Params, ServerState, Upload, split_state
from hetfed.errors import ConfigError
from hetfed.interface import own_parameters, server_step

#: the client state holding each client's current rank (client state: never uploaded)
RANK = "hetlora.rank"
#: the upload's extra holding each client's ‖B A‖ (one float: counted in its uplink bytes)
SPARSITY = "sparsity"


class RanksParams(AlgorithmParams):
    ranks: list[int] | None = Field(None, description="each client's initial rank, in client order (null: drawn "
                                                       "uniformly from min_rank … model.rank, each client's own draw)")
    min_rank: int = Field(1, ge=1, description="the smallest rank a client is drawn or prunes to")


class HetLoRAParams(RanksParams):
    gamma: float = Field(0.99, gt=0, lt=1, description="γ: self-pruning keeps a client's first ⌊γ·r_k⌋ rank components")
    lam: float = Field(1e-3, ge=0, description="λ: the self-pruning term λ·‖A[⌊γr_k⌋:r_k]‖·‖B[:, ⌊γr_k⌋:r_k]‖ per "
                                               "adapter (0: no self-pruning)")


def rank_mask(ranks: torch.Tensor, r: int, start: torch.Tensor | None = None) -> torch.Tensor:
    """``[n, r]``: 1 on the rank components ``start_k ≤ j < ranks_k`` of each client (``start`` None: from 0)."""
    j = torch.arange(r, device=ranks.device)
    inside = j < ranks.unsqueeze(1)
    if start is not None:
        inside = inside & (j >= start.unsqueeze(1))
    return inside.to(torch.float32)


class ClientRanks(FedAvg):
    """Clients that train the global adapters cut to ranks of their own (client state ``RANK``: ``params.ranks``,
    or drawn from ``min_rank … model.rank``): what HetLoRA and FLoRA share."""

    def bind(self, fed, seed: int = 0, per_round: int = 1) -> None:
        super().bind(fed, seed, per_round)
        top = self.model.rank  # type: ignore[attr-defined]  # a lora_encoder (Capabilities.model_kinds)
        ranks = self.params.ranks
        if self.params.min_rank > top:
            raise ConfigError(f"{METHOD_KEY}params.min_rank = {self.params.min_rank} is not allowed: expected at most "
                              f"model.rank = {top}")
        if ranks is not None and (len(ranks) != fed.n_clients or not all(1 <= r <= top for r in ranks)):
            raise ConfigError(f"{METHOD_KEY}params.ranks = {ranks} is not allowed: expected one rank per client "
                              f"({fed.n_clients}), each from 1 to model.rank = {top}")

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        top = self.model.rank  # type: ignore[attr-defined]
        ranks = self.params.ranks
        rank = (ranks[client_id] if ranks is not None
                else int(torch.randint(self.params.min_rank, top + 1, (1,), generator=gen)))
        return {**super().client_init(client_id, gen), RANK: torch.tensor(float(rank))}

    def _pairs(self) -> list[tuple[str, str]]:
        model = self.model
        return list(zip(model.lora_names("A"), model.lora_names("B"), strict=True))  # type: ignore[attr-defined]

    def _truncated(self, params: Params, mask: torch.Tensor) -> Params:
        """The adapters cut to each client's rank (the components beyond it zero)."""
        out = dict(params)
        for a, b in self._pairs():
            out[a] = params[a] * mask.unsqueeze(2).to(params[a].dtype)
            out[b] = params[b] * mask.unsqueeze(1).to(params[b].dtype)
        return out

    def _cut(self, bc: Broadcast, states: ClientState, n: int) -> tuple[Params, ClientState, torch.Tensor]:
        """The broadcast and the clients' local parameters with the adapters cut to each client's rank; the rest of
        the clients' states (optimiser state) and their ranks."""
        states = dict(states)
        ranks = states.pop(RANK)
        local, kept_opt = split_state(states)
        top = self.model.rank  # type: ignore[attr-defined]
        return self._truncated({**bc.stacked(n), **local}, rank_mask(ranks, top)), kept_opt, ranks

    @staticmethod
    def _kept(bc: Broadcast, start: Params, params: Params, opt_state: ClientState, ranks: torch.Tensor
              ) -> ClientState:
        """What the clients keep after a step: the trained values of the parameters of their own (the model's local
        ones: client gates), their optimiser state and their ranks — every name the store held for them."""
        return {**{k: params[k] for k in start if k not in bc.params}, **opt_state, RANK: ranks}

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """A client scores the global adapters cut to its own rank (what it trains from)."""
        params, _opt, _ranks = self._cut(bc, states, n)
        return Predictor(self.model, params, own_parameters(self))


class HetLoRA(ClientRanks):
    """FedAvg on LoRA adapters whose clients train ranks of their own, prune them, and are averaged by how much
    their adapters moved the model."""

    def _tail_norms(self, params: Params, tail: torch.Tensor) -> torch.Tensor:
        """``[n]``: Σ over adapters of ‖A tail‖·‖B tail‖ (the self-pruning term without λ)."""
        total = torch.zeros(tail.shape[0], device=tail.device)
        for a, b in self._pairs():
            na = torch.linalg.vector_norm(params[a] * tail.unsqueeze(2), dim=(1, 2))
            nb = torch.linalg.vector_norm(params[b] * tail.unsqueeze(1), dim=(1, 2))
            total = total + na * nb
        return total

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        start, kept_opt, ranks = self._cut(bc, states, len(data.client_ids))
        kept = torch.floor(ranks * self.params.gamma).clamp(min=self.params.min_rank)
        tail = rank_mask(ranks, self.model.rank, kept)  # type: ignore[attr-defined]
        lam = self.params.lam
        term = (lambda p: lam * self._tail_norms(p, tail)) if lam > 0 else None
        params, opt_state, loss = train_clients(self, start, kept_opt, data, bc.lr, term)
        if lam > 0:
            with torch.no_grad():
                pruned = self._tail_norms(params, tail) < self._tail_norms(start, tail)
            ranks = torch.where(pruned & (kept < ranks), kept, ranks)
        upload = Upload.of(data, params, bc.params, loss, **{SPARSITY: self._sparsity(params).to(loss.device)})
        return upload, self._kept(bc, start, params, opt_state, ranks)

    def _sparsity(self, params: Params) -> torch.Tensor:
        """``[n]``: each client's ``Σ_layers ‖B_k A_k‖_F``, its update's size (the aggregation's weight)."""
        with torch.no_grad():
            return torch.stack([torch.linalg.matrix_norm(torch.bmm(params[b], params[a])) for a, b in self._pairs()
                                ]).sum(0)

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        """The chain's weighted mean by the sparsity weights (by sample counts while every adapter is zero)."""
        params, extra = server_step(self, state, upload.weighted_by(SPARSITY))
        return ServerState(params, state.round + 1, extra)


register(AlgorithmSpec(
    "hetlora", HetLoRA, "LoRA adapters of different ranks per client over a frozen encoder: zero-padded, averaged by "
    "their norms, self-pruned", "Cho et al. 2024, Heterogeneous LoRA for Federated Fine-tuning of On-Device "
    "Foundation Models", HetLoRAParams,
    Capabilities(uploads="every adapter's A and B (zero beyond the client's rank) and the head, a weight ‖B A‖, "
                 "training loss", stacks_runs=True, model_kinds=("lora_encoder",),
                 model_reason="it trains LoRA adapters of per-client ranks: use model.kind lora_encoder with "
                              "embed.kind wordpiece"),
    model={"kind": "lora_encoder"},
    privacy=(
        PrivacyRow(
            method="HetLoRA",
            config="`algorithm: hetlora` + `model.kind: lora_encoder`",
            params="every adapter's A and B up to the client's rank, the head",
            extra="`train_loss`; the weight ‖B A‖ in place of the sample count",
            stays="data; its rank; the frozen encoder (never sent); optimiser state when kept",
        ),
    ),
    family="global", venue="EMNLP 2024",
))
