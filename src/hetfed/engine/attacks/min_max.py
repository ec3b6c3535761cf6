"""``min_max``: the AGR-agnostic Min-Max attack (Shejwalkar and Houmansadr, NDSS 2021) — every malicious client
sends μ − γ·p, the honest updates' mean pushed along a perturbation p as far as it goes while its largest distance
to an honest update stays within the largest distance between two honest updates: as far from the honest updates as
they are from each other, so a rule that judges updates by their distances lets it in.

As the authors' code (``our_attack_dist`` in virat-shejwalkar/NDSS21-Model-Poisoning): p is ``unit_vec`` (μ/‖μ‖),
``sign`` (sign μ) or ``std`` (the honest updates' standard deviation), over all shared parameters joined; γ is found by
halving steps from ``gamma`` until two tries differ by less than 1e-5 (the largest γ that fits, to that precision;
0 when none does). Omniscient: μ, p and the distances come from the round's honest updates; under
``knowledge: partial`` from the malicious clients' own updates as they trained them, in the distances' place of the
honest ones (the paper's attacker that does not know the benign updates)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
from pydantic import Field

from hetfed.engine.attacks import ClientAttack, ColludingParams, Honest, register
from hetfed.engine.types import flat, flat_one, unflat


class AgnosticParams(ColludingParams):
    deviation: Literal["unit_vec", "sign", "std"] = Field(
        "unit_vec", description="p: the honest mean's direction, its signs, or the honest updates' spread")
    gamma: float = Field(10.0, gt=0, description="γ's first try (the search's steps halve from it)")


@dataclass(frozen=True)
class Fit:
    """How far a crafted update may go: ``measure(rows, candidate)`` of its squared distances to the honest updates
    (each a row of all shared parameters joined) at most ``bound(rows)``, the honest updates' own."""

    measure: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    bound: Callable[[torch.Tensor], torch.Tensor]

    def fits(self, rows: torch.Tensor, candidate: torch.Tensor) -> bool:
        return bool(self.measure(rows, candidate) <= self.bound(rows))


#: Min-Max: max_i ‖Δ_i − candidate‖² ≤ max_{i,j} ‖Δ_i − Δ_j‖²
FARTHEST_PAIR = Fit(lambda rows, c: (rows - c).square().sum(1).max(),
                    lambda rows: torch.cdist(rows, rows).square().max())


def search(honest: Honest, p: AgnosticParams, fit: Fit) -> dict[str, torch.Tensor]:
    """μ − γ·p for the largest γ the halving search finds within ``fit``, back in the parameters' shapes."""
    assert honest.rows is not None
    rows = flat(honest.rows)
    mean = flat_one(honest.mean)
    if p.deviation == "unit_vec":
        norm = torch.linalg.vector_norm(mean)
        dev = mean / norm if norm > 0 else torch.zeros_like(mean)
    elif p.deviation == "sign":
        dev = torch.sign(mean)
    else:
        dev = flat_one(honest.std)
    bound = fit.bound(rows)  # the honest updates' own: once
    gamma, step, found = p.gamma, p.gamma, 0.0
    while abs(found - gamma) > 1e-5:
        if bool(fit.measure(rows, mean - gamma * dev) <= bound):
            found, gamma = gamma, gamma + step / 2
        else:
            gamma -= step / 2
        step /= 2
    return unflat(mean - found * dev, honest.mean)


def min_max(honest: Honest, p: AgnosticParams) -> dict[str, torch.Tensor]:
    return search(honest, p, FARTHEST_PAIR)


register(ClientAttack("min_max", "colluding model poisoning: the honest mean pushed along p while no honest update "
                      "is farther from it than the farthest honest pair", AgnosticParams, collude=min_max,
                      reads_rows=True))
