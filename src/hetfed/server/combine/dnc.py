"""Divide-and-Conquer (DnC; Shejwalkar and Houmansadr, "Manipulating the Byzantine: Optimizing model poisoning attacks
and defenses for federated learning", NDSS 2021, Algorithm 2): the defence its authors made against their own
Min-Max and Min-Sum attacks. ``iterations`` times: a random subset of ``dims`` coordinates of the n updates, centred on
their mean; each update's outlier score is its squared projection on the top right singular vector of the centred
matrix; the n − c·m updates of the lowest scores are kept. The updates kept in every iteration are averaged.

m = ⌊``byzantine_fraction`` · n⌋ (the count of malicious clients the server assumes, as Krum's), c the
``filter_fraction``. The paper leaves b, c and the iterations as inputs; the defaults are b = 10 000 (Blades'), c = 1
and 5 iterations (FLPoison's). A model of at most ``dims`` parameters is read whole, once (every iteration would see the
same coordinates). Centring makes the scores of the models and of their updates the same. The coordinates are drawn from
the run seed and the round; when the iterations keep no update in common (the paper does not say what then), the last
iteration's are averaged."""

from __future__ import annotations

import math

import torch
from pydantic import Field

from hetfed.engine.types import Params, Upload, flat, unflat
from hetfed.server.combine import CombineRule, RuleParams, Weighed, register


class DnCParams(RuleParams):
    byzantine_fraction: float = Field(0.1, ge=0, lt=1, description="the share m/n of clients assumed malicious "
                                                                    "(m = ⌊fraction·n⌋)")
    dims: int = Field(10_000, ge=1, description="b: the coordinates subsampled each iteration (Blades' 10 000; a "
                                                "model with fewer is read whole)")
    iterations: int = Field(5, ge=1, description="how many random subsets are scored (FLPoison's 5)")
    filter_fraction: float = Field(1.0, gt=0, description="c: each iteration drops the c·m highest-scored updates")


def outlier_scores(points: torch.Tensor) -> torch.Tensor:
    """Each row's squared projection, centred on the rows' mean, on the top right singular vector of the centred
    rows."""
    centred = points - points.mean(0)
    _, _, vh = torch.linalg.svd(centred, full_matrices=False)
    scores: torch.Tensor = (centred @ vh[0]).pow(2)
    return scores


def kept(points: torch.Tensor, params: DnCParams, rng: torch.Generator) -> torch.Tensor:
    """The indices (ascending) of the rows DnC keeps: those among the n − c·m lowest scores in every iteration."""
    n, d = points.shape
    m = math.floor(params.byzantine_fraction * n)
    keep = max(1, min(n, int(n - params.filter_fraction * m)))
    common = torch.ones(n, dtype=torch.bool)
    last = common
    whole = d <= params.dims  # every iteration would score the same coordinates: once is the same
    for _ in range(1 if whole else params.iterations):
        columns = torch.arange(d) if whole else torch.randperm(d, generator=rng)[: params.dims]
        scores = outlier_scores(points[:, columns.to(points.device)]).cpu()
        last = torch.zeros(n, dtype=torch.bool)
        last[scores.argsort(stable=True)[:keep]] = True
        common &= last
    return torch.nonzero(common if common.any() else last).flatten()


def dnc(old: Params, upload: Upload, params: DnCParams, rng: torch.Generator) -> Weighed:
    models = flat({k: upload.params[k] for k in old})  # [n, d] float64
    chosen = kept(models, params, rng).to(models.device)
    return Weighed.averaging(unflat(models[chosen].mean(0), old, upload.params), chosen, len(models))


register(CombineRule("dnc", dnc, DnCParams, streams=False, draws=True,
                     summary="Divide-and-Conquer: updates scored by their projection on the top singular vector of "
                             "random coordinate subsets; the mean of those never among the c·m highest",
                     paper="Shejwalkar and Houmansadr 2021"))
