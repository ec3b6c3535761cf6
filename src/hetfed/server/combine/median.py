"""Coordinate-wise median (Yin et al. 2018), unweighted; for an even count the mean of the two middle values."""

from __future__ import annotations

from hetfed.engine.types import Params, Upload
from hetfed.server.combine import CombineRule, RuleParams, register


def median(old: Params, upload: Upload, _params: RuleParams) -> Params:
    n = len(upload.client_ids)
    return {k: v.median(0).values if n % 2 else v.sort(0).values[n // 2 - 1: n // 2 + 1].mean(0)
            for k, v in ((k, upload.params[k]) for k in old)}


register(CombineRule("median", median, RuleParams, streams=False, summary="coordinate-wise median, unweighted",
                     paper="Yin et al. 2018"))
