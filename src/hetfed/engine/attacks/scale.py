"""``scale``: a malicious client sends factor·Δ, its update enlarged."""

from __future__ import annotations

from pydantic import Field

from hetfed.engine.attacks import ClientAttack, register
from hetfed.registry import ComponentParams


class ScaleParams(ComponentParams):
    factor: float = Field(10.0, gt=0, description="how much the update is enlarged")


register(ClientAttack("scale", "model poisoning: the update scaled, factor·Δ", ScaleParams,
                      poison=lambda delta, p, noise: p.factor * delta))
