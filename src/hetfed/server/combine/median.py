"""Coordinate-wise median (Yin et al. 2018), unweighted; for an even count the mean of the two middle values."""

from __future__ import annotations

import torch

from hetfed.engine.types import Params, Upload
from hetfed.server.combine import CombineRule, RuleParams, register


def coordinate_median(stacked: torch.Tensor) -> torch.Tensor:
    """The median of each coordinate over the leading axis; for an even count the mean of the two middle values."""
    n = len(stacked)
    return stacked.median(0).values if n % 2 else stacked.sort(0).values[n // 2 - 1: n // 2 + 1].mean(0)


def median(old: Params, upload: Upload, _params: RuleParams) -> Params:
    return {k: coordinate_median(upload.params[k]) for k in old}


register(CombineRule("median", median, RuleParams, streams=False, summary="coordinate-wise median, unweighted",
                     paper="Yin et al. 2018"))
