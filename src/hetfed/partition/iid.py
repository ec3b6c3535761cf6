"""``iid``: a shuffled split into near-equal parts."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from hetfed.config import PartitionConfig
from hetfed.errors import PartitionError
from hetfed.partition import (
    Indices,
    register,
    require_clients,
)
from hetfed.registry import ComponentParams


class IIDParams(ComponentParams):
    samples_per_client: int | None = Field(None, ge=1, description="every client draws this many samples (None: the "
                                                                   "whole pool split evenly)")


def iid(x: np.ndarray, y: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator,
        client_ids: np.ndarray | None = None) -> Indices:
    """Shuffled, near-equal parts (Flower's IidPartitioner does not shuffle: we do)."""
    k = require_clients(cfg, len(y))
    perm = rng.permutation(len(y))
    if cfg.params.samples_per_client is not None:
        need = k * cfg.params.samples_per_client
        if need > len(y):
            raise PartitionError(
                f"partition.samples_per_client = {cfg.params.samples_per_client} is not allowed: "
                f"{k} clients would need {need} samples but there are {len(y)}"
            )
        perm = perm[:need]
    return [np.sort(p) for p in np.array_split(perm, k)]


register("iid", iid, Params=IIDParams)
