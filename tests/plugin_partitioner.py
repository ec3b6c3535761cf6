"""A user's plugin module, as ``plugins: [tests.plugin_partitioner]`` names it: one partitioner in one file."""

from __future__ import annotations

import numpy as np

from hetfed.partition import register, require_clients


def by_label_parity(x, y, cfg, rng, client_ids=None):
    """Clients alternate between even and odd labels: client k holds the k-th of the parity's shuffled parts."""
    k = require_clients(cfg, len(y))
    out: list[list[int]] = [[] for _ in range(k)]
    for parity in (0, 1):
        idx = rng.permutation(np.flatnonzero(y % 2 == parity))
        mine = [c for c in range(k) if c % 2 == parity] or list(range(k))
        for part, c in zip(np.array_split(idx, len(mine)), mine, strict=True):
            out[c].extend(part.tolist())
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in out]


register("plugin_label_parity", by_label_parity)
