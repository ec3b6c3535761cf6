"""Coordinate-wise trimmed mean (Yin et al. 2018): ⌊fraction·n⌋ values cut from each end, unweighted."""

from __future__ import annotations

import math

from pydantic import Field

from hetfed.engine.types import Params, Upload
from hetfed.server.combine import CombineRule, RuleParams, Weighed, register


class TrimmedMeanParams(RuleParams):
    fraction: float = Field(0.1, ge=0, lt=0.5, description="share cut from each end per coordinate")


def trimmed_mean(old: Params, upload: Upload, params: TrimmedMeanParams) -> Weighed:
    """The trimmed mean, with each update's share of the values kept (:meth:`Weighed.kept_values`)."""
    n = len(upload.client_ids)
    cut = int(math.floor(params.fraction * n))
    return Weighed.kept_values({k: upload.params[k] for k in old}, slice(cut, n - cut))


register(CombineRule("trimmed_mean", trimmed_mean, TrimmedMeanParams, streams=False,
                     summary="coordinate-wise trimmed mean, unweighted", paper="Yin et al. 2018"))
