"""``gaussian``: a malicious client sends Gaussian noise N(0, noise_std²) in place of its update."""

from __future__ import annotations

from pydantic import Field

from hetfed.engine.attacks import ClientAttack, register
from hetfed.registry import ComponentParams


class GaussianParams(ComponentParams):
    noise_std: float = Field(1.0, gt=0, description="the noise's standard deviation")


register(ClientAttack("gaussian", "model poisoning: Gaussian noise in place of the update", GaussianParams,
                      poison=lambda delta, p, noise: (noise(tuple(delta.shape)) * p.noise_std).to(delta)))
