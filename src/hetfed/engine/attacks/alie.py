"""``alie``: "a little is enough" (Baruch et al., NeurIPS 2019) — every malicious client sends μ − z·σ, the honest
updates' coordinate-wise mean shifted by z of their standard deviations: small enough per coordinate to pass the
median, trimmed mean and Krum, in one direction on every coordinate so that it adds up.

Omniscient, as in the paper's experiments and in Karimireddy et al.'s code (epfml/byzantine-robust-noniid-optimizer,
``ALittleIsEnoughAttack``): μ and σ are taken over the round's honest updates — under ``knowledge: partial``
over the malicious clients' own updates as they trained them. z, unless given, is the paper's
z_max = Φ⁻¹((n − m − s) / (n − m)) with s = ⌊n/2 + 1⌋ − m supporters needed, from the round's n clients of which m
malicious; where those counts leave no finite z (a round of two clients), z = 0: the honest mean.
"""

from __future__ import annotations

import math

import torch
from pydantic import Field
from scipy.stats import norm

from hetfed.engine.attacks import ClientAttack, ColludingParams, Honest, register


class AlieParams(ColludingParams):
    z: float | None = Field(None, description="how many standard deviations from the honest mean (None: the "
                                              "paper's z_max from the round's client counts)")


def z_max(n: int, m: int) -> float:
    """Baruch et al.'s z_max for ``n`` clients of which ``m`` are malicious (0 where it is not finite)."""
    supporters = math.floor(n / 2 + 1) - m
    z = float(norm.ppf((n - m - supporters) / (n - m))) if n > m else 0.0
    return z if math.isfinite(z) else 0.0


def alie(honest: Honest, p: AlieParams) -> dict[str, torch.Tensor]:
    z = z_max(honest.n, honest.m) if p.z is None else p.z
    return {k: mean - honest.std[k] * z for k, mean in honest.mean.items()}


register(ClientAttack("alie", "colluding model poisoning: the honest updates' mean minus z standard deviations, "
                      "each coordinate within reach of the robust rules", AlieParams, collude=alie))
