"""A user's plugin module, as ``plugins: [tests.plugin_partitioner]`` names it: one partitioner in one file, with a
parameter of its own (``partition: {kind: plugin_label_parity, odd_share: 0.5}``) — nothing else is edited."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from hetfed.partition import register, require_clients
from hetfed.registry import ComponentParams


class ParityParams(ComponentParams):
    odd_share: float = Field(0.5, gt=0, lt=1, description="the share of the clients that hold the odd labels")


def by_label_parity(x, y, cfg, rng, client_ids=None):
    """Clients hold one label parity each: the first ⌈odd_share·K⌉ hold the even labels' shuffled parts, the rest
    the odd labels'."""
    k = require_clients(cfg, len(y))
    evens = max(1, min(k - 1, k - int(np.ceil(cfg.params.odd_share * k)))) if k > 1 else 1
    out: list[list[int]] = [[] for _ in range(k)]
    for parity, mine in ((0, list(range(evens))), (1, list(range(evens, k)) or list(range(k)))):
        idx = rng.permutation(np.flatnonzero(y % 2 == parity))
        for part, c in zip(np.array_split(idx, len(mine)), mine, strict=True):
            out[c].extend(part.tolist())
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in out]


register("plugin_label_parity", by_label_parity, Params=ParityParams)
