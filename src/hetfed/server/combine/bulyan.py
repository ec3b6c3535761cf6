"""Bulyan (El Mhamdi, Guerraoui and Rouault, ICML 2018): Krum chosen again and again — each time the most central of
the updates left, taken out — until θ = n − 2f are chosen; then per coordinate the β = θ − 2f of them closest to
their median, averaged. Krum alone lets one coordinate of its choice be far off; the second stage bounds every
coordinate. Unweighted, as in the paper. f = ⌊fraction·n⌋, at most (n − 3)/4 so that n ≥ 4f + 3 holds; Krum's score
is Blanchard et al.'s (the squared distances to the r − f − 2 nearest others of the r updates left; at least the
nearest one, as the ``krum`` rule counts them: the last choice leaves r − f − 2 = f − 1, none for f = 1), the median
that of the ``median`` rule (for an even count the mean of the two middle values). Its weights (:class:`Weighed`) are
its selection's, 1/θ each: an update left out by Krum counts for nothing; a chosen one counts in the coordinates where
it is among the β nearest the median."""

from __future__ import annotations

import math

from pydantic import Field

from hetfed.engine.centrality import krum_scores
from hetfed.engine.types import Params, Upload, flat, unflat
from hetfed.server.combine import CombineRule, RuleParams, Weighed, register
from hetfed.server.combine.median import coordinate_median


class BulyanParams(RuleParams):
    byzantine_fraction: float = Field(
        0.1, ge=0, lt=0.25, description="the share f/n of clients assumed malicious (f = ⌊fraction·n⌋, at most "
        "(n − 3)/4 so that Bulyan is defined)")


def bulyan_count(n: int, fraction: float) -> int:
    """f = ⌊fraction · n⌋, capped at (n − 3) // 4 so that Bulyan's n ≥ 4f + 3 holds."""
    return max(0, min(int(math.floor(fraction * n)), (n - 3) // 4))


def bulyan(old: Params, upload: Upload, params: BulyanParams) -> Weighed:
    points = flat({k: upload.params[k] for k in old})  # [n, d] float64
    n = len(points)
    f = bulyan_count(n, params.byzantine_fraction)
    left, chosen = list(range(n)), list[int]()
    while len(chosen) < n - 2 * f:
        best = int(krum_scores(points[left], f).argsort(stable=True)[0])  # ties: the first
        chosen.append(left.pop(best))
    picked = points[chosen]
    nearest = (picked - coordinate_median(picked)).abs().argsort(dim=0, stable=True)[: len(chosen) - 2 * f]
    # its selection's weights: the trim then reads each chosen update in some coordinates
    return Weighed.averaging(unflat(picked.gather(0, nearest).mean(0), old, upload.params), chosen, n)


register(CombineRule("bulyan", bulyan, BulyanParams, streams=False,
                     summary="Bulyan: Krum chosen n − 2f times, then a trimmed mean around the median",
                     paper="El Mhamdi et al. 2018"))
