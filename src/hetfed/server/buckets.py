"""Bucketing (Karimireddy, He and Jaggi, "Byzantine-robust learning on heterogeneous datasets via bucketing", ICLR
2022): before a robust rule, the round's updates are shuffled and averaged in buckets of ``s``, and the rule combines
the bucket means. Averaging makes honest clients' updates alike where non-IID data makes them differ — what robust
rules take for an attack — while at most s·δ of the buckets hold a malicious update (δ: the malicious share), which
a rule resists while it stays under its breakdown point (the paper asks s·δ < ½).

The shuffle is drawn from the run seed and the round (the same whichever executor ran the clients); the rule gets one
row per bucket (the last holds the rest when ``s`` does not divide the round): the simple mean of its members'
parameters (the paper's), their summed sample counts (what a weighted rule weighs it by). What the rule gave a bucket
is shared by its members (:func:`member_weights`): a bucket's row is its members' simple mean, so each of them counts
for its bucket's weight over the bucket's size in the combination."""

from __future__ import annotations

import numpy as np
import torch

from hetfed.engine.rng import BUCKETS, numpy_rng
from hetfed.engine.types import Params, Upload


def buckets(n: int, size: int, seed: int, rnd: int) -> list[np.ndarray]:
    """Rows ``0 … n − 1`` shuffled (from ``seed`` and round ``rnd``) and cut into buckets of ``size``."""
    order = numpy_rng(seed, BUCKETS, rnd).permutation(n)
    return [order[i:i + size] for i in range(0, n, size)]


def bucket_means(upload: Upload, names: Params, groups: list[np.ndarray]) -> Upload:
    """The upload as the rule reads it after bucketing into ``groups`` (:func:`buckets`): one row per bucket of the
    parameters ``names`` holds."""
    device = next(iter(upload.params.values())).device if upload.params else torch.device("cpu")
    index = [torch.as_tensor(g, dtype=torch.long, device=device) for g in groups]
    params = {k: torch.stack([upload.params[k].index_select(0, i).mean(0) for i in index]) for k in names}
    counts = torch.stack([upload.num_samples.index_select(0, i.to(upload.num_samples.device)).sum() for i in index])
    return Upload(list(range(len(groups))), params, counts, {}, dict(upload.screened))


def member_weights(weights: torch.Tensor, groups: list[np.ndarray], n: int) -> torch.Tensor:
    """Each of the round's ``n`` updates' weight in a combination that gave bucket ``b`` (``groups[b]``'s members)
    ``weights[b]``: ``weights[b] / |b|`` each, since a bucket's row is its members' simple mean — an update counts for
    nothing exactly when its bucket does."""
    out = torch.zeros(n, dtype=torch.float64)
    for w, members in zip(weights.double().cpu(), groups, strict=True):
        out[torch.as_tensor(members, dtype=torch.long)] = w / len(members)
    return out
