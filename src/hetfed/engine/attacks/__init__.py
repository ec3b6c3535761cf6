"""Simulated malicious clients, for testing defences (``attack: {kind, fraction, …its own keys}``).

Each kind is one module of this package registering a :class:`ClientAttack` with its own parameters (``Params``):
model poisoning changes what a malicious client uploads — ``poison(delta, params, noise)`` maps its update
Δ = θ_k − θ_global of one parameter to what it sends (``noise(shape)``: that client's own Gaussian draws for the
parameter, from the run seed) — and data poisoning changes the labels it trains on (``flips_labels``). A
*colluding* attack (``collude``) is omniscient, as in the papers that break robust rules with it (Baruch et al. 2019,
Xie et al. 2020, Shejwalkar and Houmansadr 2021): its malicious clients see the round's honest updates and all send
one crafted update made from them (:class:`Honest`; :class:`hetfed.engine.faults.Colluding`). ``none`` does none of
these. Which clients are malicious and how they are simulated: :class:`hetfed.engine.faults.Adversary`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hetfed.registry import ComponentParams, Registry


@dataclass(frozen=True)
class Honest:
    """What a colluding attack knows of a round's honest updates Δ = θ_k − θ_global, per shared parameter (float64):
    their coordinate-wise ``mean`` and standard deviation ``std`` (n − 1 in the denominator; 0 for fewer than two),
    every update stacked (``rows``, ``[honest, …]``: held only for an attack that ``reads_rows``, else None); ``n``
    clients in the round, ``m`` of them malicious."""

    mean: dict[str, torch.Tensor]
    std: dict[str, torch.Tensor]
    rows: dict[str, torch.Tensor] | None
    n: int
    m: int


@dataclass(frozen=True)
class ClientAttack:
    """One registered attack: ``poison`` (None: the update is sent as it is), whether the labels are flipped
    ``y → C − 1 − y``, and ``collude(honest, params)``: the update Δ (per shared parameter) every malicious client of
    a round sends in place of its own, made from the round's :class:`Honest` updates (``reads_rows``: from each of
    them, not only their mean and spread)."""

    name: str
    summary: str
    Params: type[ComponentParams] = ComponentParams
    poison: Callable[[torch.Tensor, Any, Callable[[tuple[int, ...]], torch.Tensor]], torch.Tensor] | None = None
    flips_labels: bool = False
    collude: Callable[[Honest, Any], dict[str, torch.Tensor]] | None = None
    reads_rows: bool = False

    @property
    def acts(self) -> bool:
        """Whether malicious clients do anything (``none`` does not)."""
        return self.poison is not None or self.flips_labels or self.collude is not None


ATTACKS: Registry[ClientAttack] = Registry("attack", __name__, "attack.kind", noun="client attack")


def register(attack: ClientAttack) -> ClientAttack:
    return ATTACKS.register(attack.name, attack)
