"""Coordinate-wise median (Yin et al. 2018), unweighted; for an even count the mean of the two middle values."""

from __future__ import annotations

import torch

from hetfed.engine.types import Params, Upload
from hetfed.server.combine import CombineRule, RuleParams, Weighed, register


def middle(n: int) -> slice:
    """The places of a coordinate's median among ``n`` sorted values: the middle one, or the middle two."""
    return slice(n // 2, n // 2 + 1) if n % 2 else slice(n // 2 - 1, n // 2 + 1)


def coordinate_median(stacked: torch.Tensor) -> torch.Tensor:
    """The median of each coordinate over the leading axis; for an even count the mean of the two middle values."""
    n = len(stacked)
    return stacked.median(0).values if n % 2 else stacked.sort(0).values[middle(n)].mean(0)


def median(old: Params, upload: Upload, _params: RuleParams) -> Weighed:
    """The median, with each update's share of the values kept (:meth:`Weighed.kept_values`)."""
    return Weighed.kept_values({k: upload.params[k] for k in old}, middle(len(upload.client_ids)))


register(CombineRule("median", median, RuleParams, streams=False, summary="coordinate-wise median, unweighted",
                     paper="Yin et al. 2018"))
