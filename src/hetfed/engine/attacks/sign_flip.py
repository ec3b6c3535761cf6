"""``sign_flip``: a malicious client sends −factor·Δ, its update reversed and enlarged."""

from __future__ import annotations

from pydantic import Field

from hetfed.engine.attacks import ClientAttack, register
from hetfed.registry import ComponentParams


class SignFlipParams(ComponentParams):
    factor: float = Field(4.0, gt=0, description="how much the reversed update is enlarged")


register(ClientAttack("sign_flip", "model poisoning: the update reversed and scaled, −factor·Δ", SignFlipParams,
                      poison=lambda delta, p, noise: -p.factor * delta))
