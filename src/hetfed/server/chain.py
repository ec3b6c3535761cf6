"""One server pipeline for every algorithm whose server holds a model, composed like optax's ``chain``.

    screen (as updates arrive: :class:`hetfed.server.screen.Screen`, fed by the executors)
      → combine (a registered rule, ``server.combine``: mean, median, trimmed mean, Krum, Multi-Krum)
        or, under ``privacy``, DP-FedAvg's noised mean (:mod:`hetfed.server.dp`)
      → rescale of the pseudo-gradient (FedNova's τ_eff; 1 leaves it)
      → server optimiser on the pseudo-gradient (``server.optimizer.kind``: sgd, avgm, adagrad, adam, yogi)

Each step is a value with ``init(params) -> state`` and ``update(round, state) -> (round, state)``
over a :class:`Round` (the reference model, the screened upload and what the steps before made of
them); :class:`Chain` runs them in order and keeps their states in one dict (the server state's
``server_chain`` entry, so checkpoints hold it). A step says whether it *streams* (consumes running
sums: the mean) or needs every update of a round at once (a robust rule); the chain streams only
when all of its steps do. An algorithm's ``aggregate`` calls it through ``Algorithm.server_step`` and
then does its own server work (FedDF's distillation, SCAFFOLD's control variate …).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar, Protocol, cast

import torch

from hetfed.engine.rng import DP_NOISE, derive_seed
from hetfed.engine.types import Params, Upload
from hetfed.server.combine import CombineRule, RuleParams
from hetfed.server.dp import DPNoise
from hetfed.server.optimizers import ServerOptimizer
from hetfed.server.transport import Transport


@dataclass(frozen=True)
class ScreenSpec:
    """``server.screen``: the norm filter's factor (None: off) and how many first updates set its median."""

    norm_factor: float | None = 10.0
    reference_clients: int = 32


@dataclass(frozen=True)
class Round:
    """What flows through the chain in one round."""

    reference: Params  # the global model the round started from
    upload: Upload  # the screened updates
    value: Params | None = None  # what the steps so far made of them (the new model, at the end)
    round: int = 0
    seed: int = 0  # the run seed (DP's noise stream)
    expected_clients: int = 1  # DP's fixed denominator m
    scale: float = 1.0  # the pseudo-gradient's multiplier before the optimiser (FedNova's τ_eff)


#: a step's state between rounds (plain data, checkpointed)
State = dict[str, Any]


class Step(Protocol):
    name: str
    streams: bool

    def init(self, params: Params) -> State: ...

    def update(self, r: Round, state: State) -> tuple[Round, State]: ...


class Stateless:
    """A step that keeps nothing from round to round."""

    def init(self, params: Params) -> State:
        return {}


@dataclass(frozen=True)
class Combine(Stateless):
    """A registered combine rule with its parameters."""

    rule: CombineRule
    params: RuleParams
    name: str = "combine"

    @property
    def streams(self) -> bool:
        return self.rule.streams

    def update(self, r: Round, state: State) -> tuple[Round, State]:
        return replace(r, value=self.rule.combine(r.reference, r.upload, self.params)), state


@dataclass(frozen=True)
class PrivateMean(Stateless):
    """DP-FedAvg's aggregate in the combine step's place."""

    noise: DPNoise
    name: str = "combine"
    streams: bool = True

    def update(self, r: Round, state: State) -> tuple[Round, State]:
        value = self.noise.aggregate(r.reference, r.upload, r.expected_clients,
                                     derive_seed(r.seed, DP_NOISE, r.round))
        return replace(r, value=value), state


@dataclass(frozen=True)
class Rescale(Stateless):
    """x + scale·(value − x): the round's scale (FedNova's τ_eff) on the pseudo-gradient; 1 leaves it."""

    name: str = "rescale"
    streams: bool = True

    def update(self, r: Round, state: State) -> tuple[Round, State]:
        if r.scale == 1.0:
            return r, state
        value = _combined(r)  # v + scale·(value − v), its three operations in that order, into one new tensor
        return replace(r, value={k: torch.sub(value[k], v).mul_(r.scale).add_(v) for k, v in r.reference.items()}), state


@dataclass(frozen=True)
class Optimize:
    """The server optimiser on the pseudo-gradient value − reference."""

    optimizer: ServerOptimizer
    name: str = "optimizer"
    streams: bool = True

    def init(self, params: Params) -> State:
        return self.optimizer.init(params)

    def update(self, r: Round, state: State) -> tuple[Round, State]:
        new, state = self.optimizer.update(r.reference, _combined(r), state)
        return replace(r, value=new), state


def _combined(r: Round) -> Params:
    """What the combine step made of the round (the steps after it need it)."""
    if r.value is None:
        raise RuntimeError("a chain step after combine ran before it: the chain needs a combine step first")
    return r.value


@dataclass(frozen=True)
class Chain:
    """The steps of one method's server pipeline, and the screen the executors run before them."""

    STATE: ClassVar[str] = "server_chain"
    #: where a checkpoint written before the chain kept the optimiser's state (read on resume)
    LEGACY_STATE: ClassVar[str] = "server_optimizer"

    steps: tuple[Any, ...]
    screen: ScreenSpec = ScreenSpec()
    #: a round with fewer accepted updates is skipped (``server.min_clients``)
    min_clients: int = 1
    #: how uploads travel (``server.compression``): the executors encode and decode each stack's upload
    transport: Transport = Transport()

    @property
    def streams(self) -> bool:
        return all(s.streams for s in self.steps)

    def state_of(self, extra: dict[str, Any]) -> dict[str, State]:
        """The chain's state kept in a server state's ``extra`` ({} before round 1)."""
        if self.STATE in extra:
            return cast(dict[str, State], extra[self.STATE])
        return {"optimizer": extra[self.LEGACY_STATE]} if extra.get(self.LEGACY_STATE) else {}

    def step(self, params: Params, upload: Upload, state: dict[str, State], *, round: int = 0, seed: int = 0,
             expected_clients: int = 1, scale: float = 1.0) -> tuple[Params, dict[str, State]]:
        """The new global model from a round's screened updates, and the chain's new state (the states of the
        steps that keep one, by step name)."""
        r = Round(params, upload, None, round, seed, expected_clients, scale)
        new_state: dict[str, State] = {}
        for s in self.steps:
            r, st = s.update(r, state.get(s.name, {}))
            if st:
                new_state[s.name] = st
        return _combined(r), new_state
