"""``dirichlet`` [FedMoE, Hsu et al.]: per-class proportions over clients from Dir(α)."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from hetfed.config import PartitionConfig
from hetfed.partition import (
    Indices,
    allocate_counts,
    class_counts,
    draw_per_client,
    meet_min_size,
    register,
    require_clients,
    require_min_size,
)
from hetfed.registry import ComponentParams


class DirichletParams(ComponentParams):
    alpha: float = Field(0.5, gt=0, description="the Dirichlet concentration α: small is skewed, large near IID")
    min_size: int = Field(10, ge=0, description="clients short of this many samples are topped up from the largest "
                                                "(one pass)")
    samples_per_client: int | None = Field(None, ge=1, description="each client draws its class shares from Dir(α) and "
                                                                   "this many samples (FedMoE: 100)")


def dirichlet(x: np.ndarray, y: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator,
              client_ids: np.ndarray | None = None) -> Indices:
    """Per-class proportions over clients from Dir(α); clients under ``min_size`` are topped up by construction.

    Class c's samples are split over the K clients by one Dir(α·1_K) draw (Yurochkin
    et al. / Wang et al.'s class-wise split). Instead of redrawing until every client
    has ``min_size`` samples — which loops for many clients or small α — the first
    draw is kept and :func:`meet_min_size` moves the missing samples from the
    largest clients, so it runs once at any K (100 000 clients in seconds).
    """
    k = require_clients(cfg, len(y))
    n_classes = int(y.max()) + 1
    require_min_size(cfg.params.min_size, k, len(y))
    if cfg.params.samples_per_client is not None:
        props = rng.dirichlet(np.full(n_classes, cfg.params.alpha), size=k)
        return draw_per_client(y, props, cfg.params.samples_per_client, rng, "partition.kind = 'dirichlet'",
                               fallback=True)
    weights = rng.dirichlet(np.full(k, cfg.params.alpha), size=n_classes).T  # K × C
    counts = class_counts(y, weights)
    if cfg.params.min_size:
        counts = meet_min_size(counts, cfg.params.min_size, rng)
    return allocate_counts(y, counts, rng)


register("dirichlet", dirichlet, Params=DirichletParams)
