"""Krum (Blanchard et al. 2017): the one update whose n − f − 2 nearest others are closest."""

from __future__ import annotations

import math

import torch
from pydantic import Field

from hetfed.engine.centrality import krum_scores
from hetfed.engine.types import Params, Upload, flat
from hetfed.server.combine import CombineRule, RuleParams, Weighed, register


class KrumParams(RuleParams):
    byzantine_fraction: float = Field(
        0.1, ge=0, lt=0.5, description="the share f/n of clients assumed malicious (f = ⌊fraction·n⌋, at most "
        "(n − 3)/2 so that Krum is defined)")


def byzantine_count(n: int, fraction: float) -> int:
    """f = ⌊fraction · n⌋, capped at (n − 3) // 2 so that Krum's n > 2f + 2 holds."""
    return max(0, min(int(math.floor(fraction * n)), (n - 3) // 2))


def chosen(stacked: dict[str, torch.Tensor], fraction: float, keep: int | None) -> torch.Tensor:
    """The indices of the ``keep`` best-scored updates (1: Krum), best first (ties by index)."""
    n = next(iter(stacked.values())).shape[0]
    f = byzantine_count(n, fraction)
    scores = krum_scores(flat(stacked), f)
    m = min(keep or n - f, n)
    return scores.argsort(stable=True)[:m].to(next(iter(stacked.values())).device)


def krum(old: Params, upload: Upload, params: KrumParams) -> Weighed:
    stacked = {k: upload.params[k] for k in old}
    best = chosen(stacked, params.byzantine_fraction, 1)
    return Weighed.averaging({k: v[best].mean(0) for k, v in stacked.items()}, best, len(upload.client_ids))


register(CombineRule("krum", krum, KrumParams, streams=False, summary="Krum: the most central update",
                     paper="Blanchard et al. 2017"))
