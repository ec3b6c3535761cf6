"""Multi-Krum (Blanchard et al. 2017): the mean of the m best-scored updates by Krum's score.

Uniform, as in the paper; ``weighted: true`` averages the kept updates by their sample counts, as
Flower's ``MultiKrum`` strategy does."""

from __future__ import annotations

import torch
from pydantic import Field

from hetfed.engine.types import Params, Upload
from hetfed.server.combine import CombineRule, Weighed, register
from hetfed.server.combine.krum import KrumParams, chosen


class MultiKrumParams(KrumParams):
    keep: int | None = Field(None, ge=1, description="updates averaged (None: n − f)")
    weighted: bool = Field(False, description="average the kept updates weighted by sample counts (as Flower's "
                           "MultiKrum) instead of uniformly (as Blanchard et al.)")


def multi_krum(old: Params, upload: Upload, params: MultiKrumParams) -> Weighed:
    stacked = {k: upload.params[k] for k in old}
    kept = chosen(stacked, params.byzantine_fraction, params.keep)
    if not params.weighted:
        return Weighed.averaging({k: v[kept].mean(0) for k, v in stacked.items()}, kept, len(upload.client_ids))
    w = upload.num_samples.to(kept.device)[kept].double()
    w = w / w.sum()
    weights = torch.zeros(len(upload.client_ids), dtype=torch.float64)
    weights[kept.cpu()] = w.cpu()
    return Weighed({k: torch.tensordot(w.to(v.dtype), v[kept], dims=1) for k, v in stacked.items()}, weights)


register(CombineRule("multi_krum", multi_krum, MultiKrumParams, streams=False,
                     summary="Multi-Krum: the mean of the m most central updates", paper="Blanchard et al. 2017"))
