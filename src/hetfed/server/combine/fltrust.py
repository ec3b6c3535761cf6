"""FLTrust (Cao, Fang, Liu and Gong, "FLTrust: Byzantine-robust federated learning via trust bootstrapping", NDSS 2021,
Algorithm 1): the server holds a small clean root set and trains on it each round as a client would
(:mod:`hetfed.engine.root`), which gives its own update g_0. Each client's update g_i earns the trust score
TS_i = ReLU(cos(g_i, g_0)) and is rescaled to g_0's norm; the round's update is Σ TS_i · (‖g_0‖/‖g_i‖) g_i / Σ TS_j —
an update pointing away from the server's gets no weight, and none can outweigh it by its size. Updates here are
models' differences from the round's reference (θ_i − θ; the paper's g = θ − θ_i, the same cosines and norms), over
every shared parameter; the clients' sample counts are not read (the paper's weights are the trust scores).

The root set is a ``server_data`` holdout whose labels the server keeps (``server_data.max_samples``: the paper's 100
by default in its experiments; hetfed's holdout takes ``server_data.fraction`` of the training pool, at most
``max_samples``), cut before partitioning, so no client holds it. What the paper leaves open: when every trust
score is 0 (every update at 90° or more from the server's) or the server's update is 0, the round's model is the
reference (no update); an update of norm 0 gets trust 0. Its weights (:class:`Weighed`): each update's share of the
trust, TS_i / Σ TS_j (each then rescaled to ‖g_0‖)."""

from __future__ import annotations

import torch

from hetfed.engine.types import Params, Upload, flat, flat_one, unflat
from hetfed.server.combine import CombineRule, RuleParams, Weighed, register


def trust_weighted(updates: torch.Tensor, server: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FLTrust's update from the clients' ``updates`` ``[n, d]`` and the server's ``server`` ``[d]``: the trust-score
    weighted mean of the updates rescaled to the server's norm (zeros when every score is 0), and each update's share
    of the trust, TS_i / Σ TS_j (zeros then)."""
    none = torch.zeros(len(updates), dtype=updates.dtype, device=updates.device)
    norms = updates.norm(dim=1)
    g0 = server.norm()
    if not g0 > 0:
        return torch.zeros_like(server), none
    safe = torch.where(norms > 0, norms, torch.ones_like(norms))
    trust = ((updates @ server) / (safe * g0)).clamp(min=0)  # an update of norm 0: 0 / 1
    total = trust.sum()
    if not total > 0:
        return torch.zeros_like(server), none
    step: torch.Tensor = (trust * g0 / safe) @ updates / total
    return step, trust / total


def fltrust(old: Params, upload: Upload, params: RuleParams, root: Params) -> Weighed:
    reference = flat_one(old).to(next(iter(upload.params.values())).device)
    updates = flat({k: upload.params[k] for k in old}) - reference
    server = flat_one({k: root[k] for k in old}).to(reference.device) - reference
    step, shares = trust_weighted(updates, server)
    return Weighed(unflat(reference + step, old, upload.params), shares)


register(CombineRule("fltrust", fltrust, RuleParams, streams=False, root=True,
                     summary="each update weighted by its cosine with the server's own update on a clean root set "
                             "(ReLU'd) and rescaled to its norm",
                     paper="Cao et al. 2021"))
