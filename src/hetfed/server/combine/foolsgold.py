"""FoolsGold (Fung, Yoon and Beschastnikh, "The limitations of federated learning in sybil settings", RAID 2020):
sybils that pursue one poisoning goal send updates that point the same way round after round, while honest clients
with their own data differ. The server keeps each client's summed history of updates H_i; each round it takes their
pairwise cosine similarities, lowers a client's similarity to a more suspicious one in proportion ("pardoning"),
gives client i the weight α_i = 1 − max_j cs_ij, rescaled so the largest is 1 (then 0.99), and passed through the
logit κ·(ln(α/(1 − α)) + 0.5) clipped to [0, 1]; the new model is θ + (1/n) Σ α_i Δ_i over the round's n updates.

As the authors' code (DistributedML/FoolsGold, ``deep-fg/fg/foolsgold.py`` and its trainer): κ = 1, the history of
the output layer's weights only (``layers: last``: the last shared parameter of two or more dimensions; ``all``:
every shared parameter), the similarities over every client seen so far (each round's clients get their own
weights), the mean divided by n. The histories are the rule's state, kept in the server's checkpoints (one row of the
chosen layer a client). Refused with bucketing, whose rows are buckets, not clients.

One departure: the authors subtract an identity from the similarities to leave a client's own out, which leaves
±1e-16 on the diagonal; a client whose own similarity rounds below 0 (every other one dissimilar) then has its
similarities divided by a zero maximum and gets weight 0 for nothing (two clients whose histories point apart got 1
and 0 from the authors' code, 1 and 1 here). Here the diagonal is set to exactly 0; everywhere else the weights are
the authors' (tested)."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from hetfed.engine.types import Params, Upload, flat, flat_one, unflat
from hetfed.server.combine import CombineRule, RuleParams, Weighed, register


class FoolsGoldParams(RuleParams):
    layers: Literal["last", "all"] = Field("last", description="what a client's history holds: the output layer's "
                                                               "weights (the authors' code) or every shared parameter")
    kappa: float = Field(1.0, gt=0, description="κ: the logit's confidence (the authors' code: 1)")


def weights(histories: np.ndarray, kappa: float = 1.0) -> np.ndarray:
    """FoolsGold's weight of each client from its summed history (a row each)."""
    from sklearn.metrics.pairwise import cosine_similarity

    n = len(histories)
    if n < 2:
        return np.ones(n)
    cs = cosine_similarity(histories)
    np.fill_diagonal(cs, 0.0)  # a client's own similarity left out exactly (see the module docstring)
    most = cs.max(axis=1)  # ≥ 0: a client more suspicious than i has most[j] > most[i] ≥ 0
    with np.errstate(divide="ignore", invalid="ignore"):  # pardoning: cs_ij · most_i / most_j, in that order
        cs = np.where(most[:, None] < most[None, :], cs * most[:, None] / most[None, :], cs)
    alpha = np.clip(1 - cs.max(axis=1), 0, 1)
    top = alpha.max()
    if top == 0:  # every client the same direction as another: nothing to tell them apart by
        return np.zeros(n)
    alpha = alpha / top
    alpha[alpha == 1] = 0.99
    with np.errstate(divide="ignore"):
        alpha = kappa * (np.log(alpha / (1 - alpha)) + 0.5)
    clipped: np.ndarray = np.clip(alpha, 0, 1)  # a client as alike as another as can be (α 0, a logit of −∞): 0
    return clipped


def _history_names(old: Params, layers: str) -> list[str]:
    if layers == "all":
        return list(old)
    matrices = [k for k, v in old.items() if v.dim() >= 2]
    return matrices[-1:] or list(old)[-1:]


def foolsgold(old: Params, upload: Upload, params: FoolsGoldParams, state: dict[str, Any]
              ) -> tuple[Weighed, dict[str, Any]]:
    names = _history_names(old, params.layers)
    deltas = {k: upload.params[k].double() - old[k].to(upload.params[k].device).double() for k in old}
    rows = flat({k: deltas[k] for k in names}).cpu()
    history: dict[int, torch.Tensor] = dict(state.get("history", {}))
    for j, k in enumerate(upload.client_ids):
        history[k] = history[k] + rows[j] if k in history else rows[j].clone()
    seen = sorted(history)
    alpha = weights(torch.stack([history[k] for k in seen]).numpy(), params.kappa)
    place = {k: i for i, k in enumerate(seen)}
    w = torch.as_tensor(alpha[[place[k] for k in upload.client_ids]], dtype=torch.float64)
    moved = flat(deltas)
    n = max(len(upload.client_ids), 1)
    step = w.to(moved.device) @ moved / n
    reference = flat_one(old).to(step.device)
    return Weighed(unflat(reference + step, old, upload.params), w / n), {"history": history}


register(CombineRule("foolsgold", foolsgold, FoolsGoldParams, streams=False, remembers=True, reads_clients=True,
                     summary="each client weighted by how unlike the others its summed history of updates is "
                             "(against sybils)",
                     paper="Fung et al. 2020"))
