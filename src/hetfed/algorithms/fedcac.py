"""FedCAC (Wu, Wang, Chen, Zhang, Jiao 2023, "Bold but Cautious: Unlocking the Potential of Personalized Federated
Learning through Cautiously Aggressive Collaboration", ICCV), as PFLlib's ``clientcac`` / ``servercac``.

Each client marks its **critical parameters** after training: per parameter tensor, the fraction τ
(``params.tau``) of entries with the largest sensitivity ``c = |(θ − θ_start) ⊙ θ|`` (the update times the
trained value; the threshold is the ⌊τ·n⌋-th largest c, or — when that is ≤ 1e-10 — the smallest c above 1e-20),
and uploads its model with the mask. The server

- averages the models into the global model (FedAvg, through the server pipeline), for the non-critical
  parameters everyone shares;
- measures how much the clients' critical parameters overlap,
  ``o(i, j) = 1 − Σ|m_i − m_j| / (2·Σ m_i)``, and sets the round's threshold
  ``ō + (t + 1)/β·(max o − ō)`` (ō: the mean over pairs i ≠ j; t the round, from 0; ``params.beta``), which
  rises over the rounds so clients collaborate boldly at first and cautiously later;
- gives each client i a **customised model**: the plain mean of its own model and those of the clients j with
  ``o(i, j)`` ≥ the threshold. The server keeps one per client (a table of N models, sent to each client alone:
  :attr:`hetfed.engine.types.Broadcast.personal`).

A client starts its round (and predicts) from ``m ⊙ θ_customised + (1 − m) ⊙ θ_global``, m its last mask (the
global model until it has a mask and the server a customised model for it). Defaults τ = 0.5 and β = 100 are the
authors' (their code's arguments; FL-bench uses β = 170).

One departure from PFLlib: PFLlib skips the customised models after the first round, so a client's critical
parameters restart in round 2 from the initial model (its clients' ``customized_model`` starts as a copy of it);
here the customised models are computed from the first round's uploads on.
"""

from __future__ import annotations

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
from hetfed.engine.evaluate import Predictor
from hetfed.engine.types import Broadcast, ClientData, ClientState, Params, ServerState, Upload, split_state
from hetfed.models.base import prefixed, without

#: the client's critical-parameter mask of shared parameter ``name`` is its state ``cac.mask.<name>``
MASK = "cac.mask."
#: 1 once the client has a mask
HAS_MASK = "cac.has_mask"
#: the server's customised model of parameter ``name``: ``cac.<name>`` in its table (and a client's personal row)
CUSTOM = "cac."
#: 1 for the clients the server holds a customised model for
KNOWN = "cac.known"


class FedCACParams(AlgorithmParams):
    tau: float = Field(0.5, ge=0, le=1, description="τ, the share of each parameter tensor a client marks critical")
    beta: float = Field(100.0, gt=0, description="β: the overlap threshold rises by (t + 1)/β of (max − mean) "
                                                 "each round t (the authors' default 100)")


def critical_mask(start: torch.Tensor, trained: torch.Tensor, tau: float) -> torch.Tensor:
    """Each client's critical entries [n, …] of one parameter tensor (1.0 critical, 0.0 not): the ⌊τ·numel⌋ largest
    ``|(trained − start) ⊙ trained|``, as PFLlib's ``evaluate_critical_parameter``."""
    n = trained.shape[0]
    c = ((trained - start) * trained).abs().reshape(n, -1)
    k = int(tau * c.shape[1])
    if k == 0:
        return torch.zeros_like(trained)
    thresh = c.topk(k, dim=1).values[:, -1]
    smallest = c.masked_fill(c <= 1e-20, float("inf")).min(dim=1).values  # the smallest non-zero sensitivity
    thresh = torch.where((thresh <= 1e-10) & torch.isfinite(smallest), smallest, thresh)
    return (c >= thresh[:, None]).to(trained.dtype).reshape(trained.shape)


def overlaps(masks: torch.Tensor) -> torch.Tensor:
    """``o(i, j) = 1 − Σ|m_i − m_j| / (2·Σ m_i)`` for every pair of clients' flattened masks [k, P] → [k, k]."""
    m = masks.to(torch.float64)
    return 1 - torch.cdist(m, m, p=1) / (2 * m.sum(1, keepdim=True))


def collaborators(o: torch.Tensor, round: int, beta: float) -> torch.Tensor:
    """[k, k] bool: whom each client's customised model averages — itself and every j ≠ i with o(i, j) at least
    the round's threshold ``ō + (t + 1)/β·(max o − ō)`` over the pairs i ≠ j."""
    k = o.shape[0]
    off = ~torch.eye(k, dtype=torch.bool)
    if k < 2:
        return ~off
    pairs = o[off]
    mean, top = pairs.mean(), pairs.max()
    threshold = mean + (round + 1) / beta * (top - mean)
    return (o >= threshold) & off | ~off


class FedCAC(FedAvg):
    """FedAvg for the non-critical parameters; per-client customised models for the critical ones."""


    def _shared(self) -> list[str]:
        return [s.name for s in self.model.specs() if not s.local and not s.buffer]

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        state = super().client_init(client_id, gen)
        masks = {MASK + s.name: torch.zeros(s.shape) for s in self.model.specs() if s.name in self._shared()}
        return {**state, **masks, HAS_MASK: torch.tensor(0.0)}

    def broadcast(self, state: ServerState, round: int) -> Broadcast:
        bc = super().broadcast(state, round)
        table = state.extra.get("customised")
        if not table:
            return bc
        return Broadcast(bc.params, bc.round, bc.lr, bc.extra,
                         personal={**prefixed(table, CUSTOM), KNOWN: state.extra["known"]})

    def _start(self, bc: Broadcast, local: ClientState, n: int) -> Params:
        """Each client's starting model: its critical entries from its customised model, the rest global."""
        received = bc.stacked(n)
        if not bc.personal:
            return received
        ready = (local[HAS_MASK] * bc.personal[KNOWN]).to(torch.bool)  # [n]
        start = dict(received)
        for name in self._shared():
            mask = local[MASK + name].to(torch.bool) & ready.view(-1, *([1] * (local[MASK + name].dim() - 1)))
            start[name] = torch.where(mask.to(received[name].device), bc.personal[CUSTOM + name].to(received[name]),
                                      received[name])
        return start

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        local, kept_opt = split_state(states)
        start = self._start(bc, local, n)
        mine = without(local, "cac.")  # the model's own local parameters
        params, opt_state, loss = train_clients(self, {**start, **mine}, kept_opt, data, bc.lr)
        masks = {MASK + k: critical_mask(start[k].to(params[k]), params[k], self.params.tau) for k in self._shared()}
        flat = torch.cat([masks[MASK + k].reshape(n, -1) for k in self._shared()], dim=1).to(torch.uint8)  # 0/1
        upload = Upload.of(data, params, bc.params, loss, critical=flat)
        return upload, {**{k: params[k] for k in mine}, **masks, HAS_MASK: torch.ones(n), **opt_state}

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        new = super().aggregate(state, upload)
        if not upload.client_ids:
            return new
        table = state.extra.get("customised") or {k: torch.zeros(self._clients, *v.shape, dtype=v.dtype)
                                                  for k, v in state.params.items() if k in self._shared()}
        known = state.extra.get("known", torch.zeros(self._clients))
        together = collaborators(overlaps(upload.extra["critical"].cpu()), state.round, self.params.beta)
        weights = together.to(torch.float64) / together.sum(1, keepdim=True)  # a plain mean over each group
        ids = torch.as_tensor(upload.client_ids, dtype=torch.long)
        table, known = {k: v.clone() for k, v in table.items()}, known.clone()
        for name, rows in table.items():
            theta = upload.params[name].detach().cpu().to(torch.float64)
            rows[ids] = torch.tensordot(weights, theta, dims=1).to(rows.dtype)
        known[ids] = 1.0
        return ServerState(new.params, new.round, {**new.extra, "customised": table, "known": known})

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """Each client predicts with the model it would start its next round from."""
        local, _ = split_state(states)
        mine = without(local, "cac.")
        return Predictor(self.model, {**self._start(bc, local, n), **mine}, True)


register(AlgorithmSpec(
    "fedcac", FedCAC, "FedAvg for each client's non-critical parameters; its critical ones from a customised "
                      "model averaged with the clients whose critical parameters overlap its own",
    "Wu et al. 2023, Bold but Cautious: Unlocking the Potential of Personalized Federated Learning through "
    "Cautiously Aggressive Collaboration", FedCACParams,
    Capabilities(uploads="shared parameters, sample count, training loss, its critical-parameter mask",
                 whole_round=True, personalises=True, per_client=True, stacks_runs=True),
    privacy=(
        PrivacyRow(
            method="FedCAC",
            config="`algorithm: fedcac`",
            params="shared model parameters",
            extra="`train_loss`, `critical` (which of its parameters it marked critical: a 0/1 mask, a byte each)",
            stays="data; its mask between rounds; optimiser state when kept (the server holds a customised "
                  "model per client and sends each its own)",
        ),
    ),
    family="personalised", venue="ICCV 2023",
))
