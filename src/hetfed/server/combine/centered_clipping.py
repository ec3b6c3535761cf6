"""Centered clipping (Karimireddy, He and Jaggi, "Learning from history for Byzantine robust optimization", ICML
2021): the aggregate update v starts where the last round's ended and moves ``iterations`` times by the mean of the
updates' differences from it, each clipped to norm ≤ τ — so no update pulls it further than τ a step, however large,
and honest updates that agree pull it all the way. As the authors' code (epfml/byzantine-robust-noniid-optimizer,
``Clipping``) and Blades' ``Centeredclipping``: unweighted, the norm over all shared parameters, the centre zero
before the first round and kept between rounds (in the server's checkpoints)."""

from __future__ import annotations

from typing import Any

import torch
from pydantic import Field

from hetfed.engine.types import Params, Upload, flat, flat_one, unflat
from hetfed.server.combine import CombineRule, RuleParams, register


class CenteredClippingParams(RuleParams):
    radius: float = Field(10.0, gt=0, description="τ: each update's difference from the centre is clipped to this "
                                                  "norm (Blades' default 10)")
    iterations: int = Field(5, ge=1, description="clipping steps a round (Blades' default 5; the authors' code: 1)")


def centered_clipping(old: Params, upload: Upload, params: CenteredClippingParams,
                      state: dict[str, Any]) -> tuple[Params, dict[str, Any]]:
    deltas = flat({k: upload.params[k] - old[k].to(upload.params[k].device) for k in old})  # [n, d] float64
    center = state.get("center")
    v = torch.zeros(deltas.shape[1], dtype=torch.float64, device=deltas.device) if center is None else \
        center.to(deltas.device)
    for _ in range(params.iterations):
        diff = deltas - v
        scale = (params.radius / torch.linalg.vector_norm(diff, dim=1)).clamp(max=1.0)  # a zero difference: 1
        v = v + (diff * scale.unsqueeze(1)).mean(0)
    return unflat(flat_one(old).to(v.device) + v, old, upload.params), {"center": v.cpu()}


register(CombineRule("centered_clipping", centered_clipping, CenteredClippingParams, streams=False, remembers=True,
                     summary="the last round's aggregate moved by the mean of the updates' clipped differences from it",
                     paper="Karimireddy et al. 2021"))
