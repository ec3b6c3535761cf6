"""The geometric median of the updates (RFA: Pillutla, Kakade and Harchaoui, IEEE TSP 2022): the point whose
weighted sum of Euclidean distances to the clients' models is least, approximated by the smoothed Weiszfeld algorithm
as the authors' own implementation does (``RobustWeiszfeldFactory`` in tensorflow/federated's RFA example): start at
the weighted mean, then ``passes − 1`` times reweight each client by α_k / max(ν, ‖z − θ_k‖) and take the weighted
mean again. One update far away moves it by a bounded amount whatever its size (breakdown point ½ of the weight)."""

from __future__ import annotations

import torch
from pydantic import Field

from hetfed.engine.types import Params, Upload, flat, unflat
from hetfed.server.combine import CombineRule, RuleParams, Weighed, register


class GeometricMedianParams(RuleParams):
    passes: int = Field(5, ge=1, description="weighted means taken (the first: the mean, weighted as `weighted` "
                                             "says; the authors' default 5)")
    tolerance: float = Field(1e-6, gt=0, description="ν: a distance below it counts as ν (the smoothing)")
    weighted: bool = Field(True, description="α_k = the clients' sample counts, as in RFA (false: equal weights)")


def geometric_median(old: Params, upload: Upload, params: GeometricMedianParams) -> Weighed:
    points = flat({k: upload.params[k] for k in old})  # [n, d] float64
    alpha = upload.num_samples.to(points.device).double() if params.weighted else \
        torch.ones(len(points), dtype=torch.float64, device=points.device)
    weights = alpha
    for _ in range(params.passes - 1):
        z = weights @ points / weights.sum()
        weights = alpha / torch.linalg.vector_norm(points - z, dim=1).clamp_min(params.tolerance)
    # the last pass's weights, as shares: the median is their weighted mean of the models
    return Weighed(unflat(weights @ points / weights.sum(), old, upload.params), weights / weights.sum())


register(CombineRule("geometric_median", geometric_median, GeometricMedianParams, streams=False,
                     summary="geometric median of the updates by smoothed Weiszfeld (RFA)",
                     paper="Pillutla et al. 2022"))
