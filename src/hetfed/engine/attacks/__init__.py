"""Simulated malicious clients, for testing defences (``attack: {kind, fraction, …its own keys}``).

Each kind is one module of this package registering a :class:`ClientAttack` with its own parameters (``Params``):
model poisoning changes what a malicious client uploads — ``poison(delta, params, noise)`` maps its update
Δ = θ_k − θ_global of one parameter to what it sends (``noise(shape)``: that client's own Gaussian draws for the
parameter, from the run seed) — and data poisoning changes the samples it trains on (``poison_data``: its labels
flipped, or a trigger stamped on some of its samples and their labels set to a target — a backdoor, whose success
is measured on the global test set stamped the same way, ``backdoor_test``). A
*colluding* attack (``collude``) sends an update crafted from a round's benign updates — the same for all its malicious
clients, or each its own (:class:`Honest`; :class:`hetfed.engine.faults.Colluding`) — from what its ``knowledge``
(:class:`ColludingParams`) gives it: the round's honest updates (``full``, the default: omniscient, as in the papers'
experiments that break robust rules with these attacks — Baruch et al. 2019, Xie et al. 2020, Shejwalkar and
Houmansadr 2021, Fang et al. 2020), or only its own malicious clients' updates as they trained them (``partial``: Fang
et al.'s partial knowledge; Shejwalkar and Houmansadr's attacker that does not know the benign updates). ``none`` does
none of these. Which clients are malicious and how they are simulated: :class:`hetfed.engine.faults.Adversary`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from hetfed.registry import ComponentParams, Registry


class ColludingParams(ComponentParams):
    """The parameters every colluding attack has (its own ``Params`` derive from this): whose updates it knows."""

    knowledge: Literal["full", "partial"] = Field(
        "full", description="full: the round's honest updates (omniscient); partial: only the malicious clients' own "
                            "updates as they trained them (Fang et al.'s partial knowledge)")


@dataclass(frozen=True)
class Honest:
    """What a colluding attack knows of a round's benign updates Δ = θ_k − θ_global — the honest clients' under
    ``knowledge: full``, its malicious clients' own as they trained them under ``partial`` — per shared parameter
    (float64): their coordinate-wise ``mean`` and standard deviation ``std`` (n − 1 in the denominator; 0 for fewer than
    two), every update stacked (``rows``, ``[known, …]``: held only for an attack that ``reads_rows``, else None); ``n``
    clients in the round, ``m`` of them malicious; ``uniform(name)``: U[0, 1) draws of the parameter's shape for each
    malicious client, ``[m, …]`` in their order (each client's own stream from the run seed, the round and the
    parameter: an attack that sends each malicious client an update of its own)."""

    mean: dict[str, torch.Tensor]
    std: dict[str, torch.Tensor]
    rows: dict[str, torch.Tensor] | None
    n: int
    m: int
    uniform: Callable[[str], torch.Tensor] | None = None


@dataclass(frozen=True)
class Samples:
    """What a data-poisoning attack reads of the pool: the model's ``input_shape`` (an image's H×W or H×W×C, the
    rows flattened in that order; a vector's (d,)), ``n_classes``, the pool's largest feature value ``x_max`` (a
    trigger's default brightness), ``rng``: a generator of the malicious client's own, from the run seed (which
    of its samples are poisoned), and ``rank``: its place among the malicious clients by id (a distributed
    backdoor's part). A test set is read with the same shape and classes, its ``rng`` and ``rank`` unused."""

    input_shape: tuple[int, ...]
    n_classes: int
    x_max: float
    rng: np.random.Generator
    rank: int = 0


#: data poisoning: a malicious client's training samples (features ``[m, d]``, labels ``[m]``) → what it trains on
PoisonData = Callable[[torch.Tensor, torch.Tensor, Samples, Any], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class ClientAttack:
    """One registered attack: ``poison`` (None: the update is sent as it is), ``poison_data`` (None: a malicious
    client trains on its own samples), ``backdoor_test`` (the global test set as the backdoor's success is measured
    on it: its samples of other classes than the target, stamped, labelled the target; None: not a backdoor),
    ``check(params, input_shape, n_classes, features)`` (a one-line refusal of a setting the data cannot take, before
    anything runs; None: fine), and ``collude(honest, params)``: the update Δ (per shared parameter) every malicious
    client of a round sends in place of its own, made from the round's :class:`Honest` updates (``reads_rows``: from
    each of them, not only their mean and spread) — one for all, or ``[m, …]``: each malicious client's own."""

    name: str
    summary: str
    Params: type[ComponentParams] = ComponentParams
    poison: Callable[[torch.Tensor, Any, Callable[[tuple[int, ...]], torch.Tensor]], torch.Tensor] | None = None
    poison_data: PoisonData | None = None
    backdoor_test: PoisonData | None = None
    check: Callable[[Any, tuple[int, ...], int, bool], str | None] | None = None
    collude: Callable[[Honest, Any], dict[str, torch.Tensor]] | None = None
    reads_rows: bool = False

    @property
    def acts(self) -> bool:
        """Whether malicious clients do anything (``none`` does not)."""
        return self.poison is not None or self.poison_data is not None or self.collude is not None


ATTACKS: Registry[ClientAttack] = Registry("attack", __name__, "attack.kind", noun="client attack")


def register(attack: ClientAttack) -> ClientAttack:
    """Register ``attack``; a colluding one declares whose updates it knows (its ``Params`` derive from
    :class:`ColludingParams`)."""
    if attack.collude is not None and not issubclass(attack.Params, ColludingParams):
        raise TypeError(f"colluding attack {attack.name!r}: its Params must derive from ColludingParams")
    return ATTACKS.register(attack.name, attack)
