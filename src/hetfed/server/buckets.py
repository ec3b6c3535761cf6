"""Bucketing (Karimireddy, He and Jaggi, "Byzantine-robust learning on heterogeneous datasets via bucketing", ICLR
2022): before a robust rule, the round's updates are shuffled and averaged in buckets of ``s``, and the rule combines
the bucket means. Averaging makes honest clients' updates alike where non-IID data makes them differ — what robust
rules take for an attack — while at most s·δ of the buckets hold a malicious update (δ: the malicious share), which
a rule resists while it stays under its breakdown point (the paper asks s·δ < ½).

The shuffle is drawn from the run seed and the round (the same whichever executor ran the clients); the rule gets one
row per bucket (the last holds the rest when ``s`` does not divide the round): the simple mean of its members'
parameters (the paper's), their summed sample counts (what a weighted rule weighs it by)."""

from __future__ import annotations

import numpy as np
import torch

from hetfed.engine.rng import BUCKETS, numpy_rng
from hetfed.engine.types import Params, Upload


def buckets(n: int, size: int, seed: int, rnd: int) -> list[np.ndarray]:
    """Rows ``0 … n − 1`` shuffled (from ``seed`` and round ``rnd``) and cut into buckets of ``size``."""
    order = numpy_rng(seed, BUCKETS, rnd).permutation(n)
    return [order[i:i + size] for i in range(0, n, size)]


def bucket_means(upload: Upload, names: Params, size: int, seed: int, rnd: int) -> Upload:
    """The upload as the rule reads it after bucketing: one row per bucket of the parameters ``names`` holds."""
    groups = buckets(len(upload.client_ids), size, seed, rnd)
    device = next(iter(upload.params.values())).device if upload.params else torch.device("cpu")
    index = [torch.as_tensor(g, dtype=torch.long, device=device) for g in groups]
    params = {k: torch.stack([upload.params[k].index_select(0, i).mean(0) for i in index]) for k in names}
    counts = torch.stack([upload.num_samples.index_select(0, i.to(upload.num_samples.device)).sum() for i in index])
    return Upload(list(range(len(groups))), params, counts, {}, dict(upload.screened))
