"""``natural``: clients given by ids in the data (``dataset.name = 'arrays'`` with a client column, Shakespeare's
roles)."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from hetfed.config import PartitionConfig
from hetfed.errors import PartitionError
from hetfed.partition import (
    Indices,
    register,
)
from hetfed.registry import ComponentParams


class NaturalParams(ComponentParams):
    natural_min_samples: int = Field(1, ge=1, description="clients holding fewer training samples are left out (their "
                                                          "data unused)")


def natural(x: np.ndarray, y: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator | None = None,
            client_ids: np.ndarray | None = None) -> Indices:
    """Clients given by ids in the data (``dataset.name = 'arrays'`` with a client column)."""
    ids = client_ids
    if ids is None:
        raise PartitionError(
            "partition.kind = 'natural' needs client ids in the data: use dataset.name = 'arrays' "
            "with a 'client' array/column"
        )
    uniq, counts = np.unique(ids, return_counts=True)
    kept = uniq[counts >= cfg.params.natural_min_samples]  # e.g. movies with too few reviews to split or learn from
    if len(kept) == 0:
        raise PartitionError(
            f"partition.natural_min_samples = {cfg.params.natural_min_samples} leaves no client: the largest holds "
            f"{counts.max()} samples; expected at most {counts.max()}"
        )
    if cfg.clients is not None and cfg.clients != len(kept):
        raise PartitionError(
            f"partition.clients = {cfg.clients} is not allowed with partition.kind = 'natural': "
            f"the data names {len(kept)} clients (with ≥ {cfg.params.natural_min_samples} samples); "
            f"expected {len(kept)} or null"
        )
    return [np.flatnonzero(ids == u).astype(np.int64) for u in kept]


register("natural", natural, ordered=True, Params=NaturalParams)
