"""``majority`` [FedMoE]: ``majority_classes`` majority classes holding a fraction ``p`` of each client's data."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from hetfed.config import PartitionConfig
from hetfed.errors import PartitionError
from hetfed.partition import (
    Indices,
    allocate_classes,
    draw_per_client,
    register,
    require_clients,
)
from hetfed.registry import ComponentParams


class MajorityParams(ComponentParams):
    p: float = Field(0.8, ge=0, le=1, description="the share of a client's data in its majority classes (2/C: IID)")
    majority_classes: int = Field(2, ge=1, description="majority classes per client")
    samples_per_client: int | None = Field(None, ge=1, description="every client draws this many samples (None: the "
                                                                   "pool split)")


def majority(x: np.ndarray, y: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator,
             client_ids: np.ndarray | None = None) -> Indices:
    """``majority_classes`` classes hold fraction p of each client's data."""
    k = require_clients(cfg, len(y))
    n_classes = int(y.max()) + 1
    m = cfg.params.majority_classes
    if m >= n_classes:
        raise PartitionError(
            f"partition.majority_classes = {m} is not allowed with {n_classes} classes: expected < {n_classes}"
        )
    # Majority classes go round-robin over a shuffled class order, so each class is
    # a majority class for (nearly) the same number of clients.
    order = rng.permutation(n_classes)
    props = np.full((k, n_classes), (1 - cfg.params.p) / (n_classes - m))
    for client in range(k):
        chosen = order[[(client * m + j) % n_classes for j in range(m)]]
        props[client, chosen] = cfg.params.p / m
    if cfg.params.samples_per_client is not None:
        return draw_per_client(y, props, cfg.params.samples_per_client, rng, "partition.kind = 'majority'")
    return allocate_classes(y, props, rng)


register("majority", majority, Params=MajorityParams)
