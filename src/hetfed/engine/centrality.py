"""Krum's score (Blanchard et al. 2017), below both of its users: the ``krum`` and ``bulyan`` combine rules, and the
attack made against them (:mod:`hetfed.engine.attacks.fang_krum`), which asks Krum what it would choose."""

from __future__ import annotations

import torch


def krum_scores(points: torch.Tensor, f: int) -> torch.Tensor:
    """Krum's score per point: the sum of squared distances to its n − f − 2 nearest others."""
    n = points.shape[0]
    dist = torch.cdist(points, points).pow(2)
    dist.fill_diagonal_(float("inf"))
    nearest = max(n - f - 2, 1)
    return dist.topk(min(nearest, n - 1), largest=False, dim=1).values.sum(1)
