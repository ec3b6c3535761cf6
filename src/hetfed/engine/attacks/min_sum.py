"""``min_sum``: the AGR-agnostic Min-Sum attack (Shejwalkar and Houmansadr, NDSS 2021) — as ``min_max``, but γ goes as
far as the crafted update's sum of squared distances to the honest updates stays within the smallest such sum of an
honest update (its score is no worse than the best honest one's)."""

from __future__ import annotations

import torch

from hetfed.engine.attacks import ClientAttack, Honest, register
from hetfed.engine.attacks.min_max import AgnosticParams, Fit, search

#: Σ_i ‖Δ_i − candidate‖² ≤ min_i Σ_j ‖Δ_i − Δ_j‖²
CLOSEST_SUM = Fit(lambda rows, c: (rows - c).square().sum(),
                  lambda rows: torch.cdist(rows, rows).square().sum(1).min())


def min_sum(honest: Honest, p: AgnosticParams) -> dict[str, torch.Tensor]:
    return search(honest, p, CLOSEST_SUM)


register(ClientAttack("min_sum", "colluding model poisoning: the honest mean pushed along p while its summed squared "
                      "distance to the honest updates beats the best honest update's", AgnosticParams,
                      collude=min_sum, reads_rows=True))
