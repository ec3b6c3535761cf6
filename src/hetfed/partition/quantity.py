"""``quantity`` [NIID-Bench's quantity skew]: clients of Dirichlet-drawn sizes, their samples drawn at random."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from hetfed.config import PartitionConfig
from hetfed.partition import Indices, apportion, register, require_clients, require_min_size
from hetfed.registry import ComponentParams


class QuantityParams(ComponentParams):
    beta: float = Field(0.5, gt=0, description="the Dirichlet concentration of the clients' sizes: small is "
                                               "skewed, large near equal")
    min_size: int = Field(10, ge=0, description="every client holds at least this many samples")


def quantity(x: np.ndarray, y: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator,
             client_ids: np.ndarray | None = None) -> Indices:
    """Client sizes from Dir(β), samples shuffled: only how much data a client holds differs, not its labels.

    NIID-Bench's quantity skew (Li et al., ICDE 2022, "iid-diff-quantity"): a random permutation of the pool cut at
    sizes proportional to one Dir(β·1_K) draw. NIID-Bench draws again until every client has 10 samples; here each
    client gets ``min_size`` samples and a Dir(β) share of the rest, so it runs once at any K and β.
    """
    k = require_clients(cfg, len(y))
    floor = cfg.params.min_size
    require_min_size(floor, k, len(y))
    perm = rng.permutation(len(y))
    sizes = floor + apportion(len(y) - floor * k, rng.dirichlet(np.full(k, cfg.params.beta)))
    return [np.sort(part).astype(np.int64) for part in np.split(perm, np.cumsum(sizes)[:-1])]


register("quantity", quantity, Params=QuantityParams)
