"""One server pipeline for every algorithm whose server holds a model, composed like optax's ``chain``.

    decode (updates that travel encoded) → screen → DP's clip (as updates arrive: :meth:`Chain.receiving`, fed by
    the executors)
      → combine (a registered rule, ``server.combine``: mean, median, trimmed mean, Krum, Multi-Krum,
        Bulyan, the geometric median, centered clipping, FLAME, FoolsGold)
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

from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, ClassVar, Protocol, cast

import torch

from hetfed.engine.rng import COMBINE_NOISE, DP_NOISE, derive_seed, torch_gen
from hetfed.engine.types import Params, RoundUploads, Upload
from hetfed.server.buckets import bucket_means, buckets, member_weights
from hetfed.server.combine import CombineRule, RuleParams, Weighed
from hetfed.server.dp import DPNoise
from hetfed.server.optimizers import ServerOptimizer
from hetfed.server.screen import Screen, ScreenSpec
from hetfed.server.transport import Transport


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
    root: Params | None = None  # the server's model trained on its root set (a rule that reads it: FLTrust)
    #: each update's weight in the combination, where the combine rule decides per update (:class:`Weighed`)
    weights: torch.Tensor | None = None


#: a step's state between rounds (plain data, checkpointed)
State = dict[str, Any]
#: where the chain's state holds what its combine rule decided in the round it last combined: ``round`` (0-based),
#: ``clients`` (the upload's ids) and ``weights`` (each one's; :class:`~hetfed.server.combine.Weighed`) — read by the
#: round loop under an attack (:mod:`hetfed.server.detection`)
DECIDED = "decided"


class Step(Protocol):
    """A chain step. One may also have ``update_runs(rounds, states) -> (rounds, states)``: :meth:`update` of several
    runs in one call (a stacked sweep's), each run's result as alone; :meth:`Chain.step_runs` calls each step that
    has it once for all its runs, and the others run by run."""

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
    """A registered combine rule with its parameters; ``bucket`` > 1: the rule combines the means of shuffled buckets
    of that many updates (:mod:`hetfed.server.buckets`)."""

    rule: CombineRule
    params: RuleParams
    name: str = "combine"
    bucket: int = 1

    @property
    def streams(self) -> bool:
        return self.rule.streams

    def update(self, r: Round, state: State) -> tuple[Round, State]:
        upload, groups = r.upload, None
        if self.bucket > 1 and len(upload.client_ids):
            groups = buckets(len(upload.client_ids), self.bucket, r.seed, r.round)
            upload = bucket_means(upload, r.reference, groups)
        given: dict[str, Any] = {"rng": torch_gen(r.seed, COMBINE_NOISE, r.round)} if self.rule.draws else {}
        if self.rule.root:
            given["root"] = r.root
        if self.rule.remembers:
            value, state = cast(tuple[Params, State], self.rule.combine(r.reference, upload, self.params, state,
                                                                        **given))
        else:
            value = cast(Params, self.rule.combine(r.reference, upload, self.params, **given))
        weights = None
        if isinstance(value, Weighed):  # a bucket's weight is shared by its members (a bucket is their mean)
            weights = value.weights if groups is None else member_weights(value.weights, groups,
                                                                           len(r.upload.client_ids))
            value = dict(value)
        return replace(r, value=value, weights=weights), state

    def update_runs(self, rounds: list[Round], states: list[State]) -> tuple[list[Round], list[State]]:
        """:meth:`update` of several runs: in one call of the rule's run-axis form where it has one
        (:attr:`CombineRule.combine_runs`) and nothing is bucketed, drawn, remembered or trained on a root set
        (each run's own inputs); run by run otherwise."""
        rule = self.rule
        combine_runs = rule.combine_runs
        if combine_runs is None or self.bucket > 1 or rule.draws or rule.remembers or rule.root:
            return _each(self, rounds, states)
        values: Sequence[Any] = combine_runs([r.reference for r in rounds], [r.upload for r in rounds], self.params)
        return [replace(r, value=dict(v), weights=v.weights if isinstance(v, Weighed) else None)
                for r, v in zip(rounds, values, strict=True)], states


def _each(step: Any, rounds: list[Round], states: list[State]) -> tuple[list[Round], list[State]]:
    """``step``'s :meth:`~Step.update` of each run in turn."""
    done = [step.update(r, state) for r, state in zip(rounds, states, strict=True)]
    return [r for r, _ in done], [state for _, state in done]


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
        return replace(r, value={k: torch.sub(value[k], v).mul_(r.scale).add_(v) for k,
                                 v in r.reference.items()}), state


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

    def update_runs(self, rounds: list[Round], states: list[State]) -> tuple[list[Round], list[State]]:
        """:meth:`update` of several runs: their models, combined models and optimiser states stacked along a run
        axis and updated in one call — an optimiser's arithmetic is elementwise, so each run's numbers are its own
        alone — where their states agree on all but their tensors (the step count); run by run otherwise, and for an
        optimiser that keeps no state (sgd: at η = 1 the combined model itself)."""
        optimizer = self.optimizer
        if type(optimizer).init is ServerOptimizer.init or len(rounds) == 1:
            return _each(self, rounds, states)
        try:
            params = _stacked([r.reference for r in rounds])
            combined = _stacked([_combined(r) for r in rounds])
            state = _stacked([st or optimizer.init(r.reference) for r, st in zip(rounds, states, strict=True)])
        except _Unlike:
            return _each(self, rounds, states)
        new, state = optimizer.update(params, combined, state)
        return ([replace(r, value=_row(new, i)) for i, r in enumerate(rounds)],
                [_row(state, i) for i in range(len(rounds))])


class _Unlike(Exception):
    """Runs' trees that do not stack (:func:`_stacked`)."""


def _stacked(trees: list[Any]) -> Any:
    """Trees of one structure (dicts of tensors and numbers) stacked leaf by leaf: tensors of one shape, type and
    device along a new first axis; any other leaf must be equal in every tree (:class:`_Unlike` otherwise)."""
    first = trees[0]
    if isinstance(first, torch.Tensor):
        if not all(isinstance(t, torch.Tensor) and (t.shape, t.dtype, t.device) == (first.shape, first.dtype,
                                                                                     first.device) for t in trees):
            raise _Unlike
        return torch.stack(trees)
    if isinstance(first, dict):
        if not all(isinstance(t, dict) and t.keys() == first.keys() for t in trees):
            raise _Unlike
        return {k: _stacked([t[k] for t in trees]) for k in first}
    if not all(type(t) is type(first) and t == first for t in trees):
        raise _Unlike
    return first


def _row(tree: Any, i: int) -> Any:
    """Run ``i``'s part of a stacked tree (its tensors' rows, as views)."""
    if isinstance(tree, torch.Tensor):
        return tree[i]
    if isinstance(tree, dict):
        return {k: _row(v, i) for k, v in tree.items()}
    return tree


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

    @cached_property
    def identity(self) -> str:
        """What makes two runs' chains the same computation — their steps, screen, transport and the parameters of
        each —, for a stacked sweep to step their runs together (:meth:`step_runs`): its text, made once."""
        return repr(self)

    @property
    def private(self) -> DPNoise | None:
        """DP-FedAvg's noise, clip and weighting when its noised mean is the combine step (client-level DP on)."""
        return next((s.noise for s in self.steps if isinstance(s, PrivateMean)), None)

    def stages(self) -> tuple[str, ...]:
        """The chain in the order a round's updates go through it: ``decode`` (updates that travel encoded: a
        compressor), ``screen`` (non-finite updates out; the norm filter when on), ``clip`` (DP-FedAvg's, per update),
        then its steps (``combine`` — a rule or DP's noised mean —, ``rescale``, ``optimizer``). The order is the only
        one that makes sense (a filter reads decoded updates, DP's noise is calibrated to clipped ones, the optimiser
        reads the combined pseudo-gradient), so it is fixed; which stages run is what ``server.*`` and ``privacy``
        choose."""
        receive = (("decode",) if self.transport.compressor is not None else ()) + ("screen",)
        return receive + (("clip",) if self.private is not None else ()) + tuple(s.name for s in self.steps)

    def norm_factor(self, asynchronous: bool = False) -> float | None:
        """The norm filter's factor for a round's updates (None: off; under DP clipping bounds every update
        already). An asynchronous server's executors screen for non-finite updates only: its norm filter judges each
        buffer of arrivals when it is merged (:meth:`buffer_screen`), the one group its events define — the clients
        an executor happens to train together depend on how it stacks them."""
        return None if asynchronous or self.private is not None else self.screen.norm_factor

    def holds_round(self, whole_round: bool = False) -> bool:
        """True when a round's updates must be held together instead of streamed: a step that needs every update (a
        robust combine rule), or an algorithm that does (``whole_round``: FedDF, FedGen). The norm filter holds only
        its reference clients (:class:`~hetfed.server.screen.Screen`)."""
        return not self.streams or whole_round

    def held_for_screen(self, per_round: int, asynchronous: bool = False) -> int:
        """How many updates of a round the norm filter holds at most (its reference clients; 0 when off)."""
        return 0 if self.norm_factor(asynchronous) is None else min(per_round, self.screen.reference_clients)

    def receiving(self, reference: Params, *, asynchronous: bool = False, whole_round: bool = False,
                  stream: bool = True) -> RoundUploads:
        """A round's receiving side, against the broadcast ``reference``: every chunk of updates fed to it is
        screened (and clipped under DP) as it comes, what passes is summed — or held, when the round must be
        (:meth:`holds_round`; ``stream`` False: held anyway, as a Flower round's replies come together)."""
        private = self.private
        screen = Screen(reference, self.norm_factor(asynchronous), private.clip if private is not None else None,
                        keep_all=self.holds_round(whole_round), uniform=private is not None and private.uniform,
                        reference_clients=self.screen.reference_clients)
        return RoundUploads(screen, stream)

    def receiving_encoded(self, reference: Params, uploads: list[Upload], *, asynchronous: bool = False,
                          whole_round: bool = False) -> Upload:
        """A round of updates that travelled encoded (a Flower round's replies): decoded, then received as above,
        held together."""
        round_uploads = self.receiving(reference, asynchronous=asynchronous, whole_round=whole_round, stream=False)
        for upload in uploads:
            round_uploads.add(self.decode(upload, reference))
        return round_uploads.result()

    def decode(self, upload: Upload, reference: Params) -> Upload:
        """An upload that travelled encoded, as the server reads it (what an attack on it is handed, too)."""
        return self.transport.decode(upload, reference)

    def buffer_screen(self) -> Screen:
        """The norm filter over an asynchronous server's buffer of arrivals (:meth:`Screen.verdict`, each arrival's
        norm against the model it was sent); off under DP, as for rounds."""
        return Screen({}, self.norm_factor(), reference_clients=self.screen.reference_clients)

    @property
    def root_rule(self) -> str | None:
        """The combine rule that reads the server's model trained on its labelled root set (FLTrust's), or None."""
        return next((s.rule.name for s in self.steps if isinstance(s, Combine) and s.rule.root), None)

    def state_of(self, extra: dict[str, Any]) -> dict[str, State]:
        """The chain's state kept in a server state's ``extra`` ({} before round 1)."""
        if self.STATE in extra:
            return cast(dict[str, State], extra[self.STATE])
        return {"optimizer": extra[self.LEGACY_STATE]} if extra.get(self.LEGACY_STATE) else {}

    def step(self, params: Params, upload: Upload, state: dict[str, State], *, round: int = 0, seed: int = 0,
             expected_clients: int = 1, scale: float = 1.0, root: Params | None = None
             ) -> tuple[Params, dict[str, State]]:
        """The new global model from a round's screened updates, and the chain's new state (the states of the
        steps that keep one, by step name; ``decided``: what the combine rule gave each update this round, where it
        weighs them — :data:`DECIDED`); ``root``: the server's model trained on its root set, where a step reads it
        (:attr:`root_rule`)."""
        return self.step_runs([self.round_of(params, upload, round=round, seed=seed, expected_clients=expected_clients,
                                             scale=scale, root=root)], [state])[0]

    @staticmethod
    def round_of(params: Params, upload: Upload, *, round: int = 0, seed: int = 0, expected_clients: int = 1,
                 scale: float = 1.0, root: Params | None = None) -> Round:
        """A run's round as :meth:`step_runs` takes it: the arguments of :meth:`step`."""
        return Round(params, upload, None, round, seed, expected_clients, scale, root)

    def step_runs(self, rounds: list[Round], states: list[dict[str, State]]) -> list[tuple[Params, dict[str, State]]]:
        """:meth:`step` of several runs of this chain (a stacked sweep's), each given as its :class:`Round` (the
        global model, the screened upload and the round's inputs; ``value`` None) and its chain state: each step that
        has a run-axis form (``update_runs``) called once for all of them, the others run by run — every run's
        model and state as :meth:`step` gives it alone."""
        new_states: list[dict[str, State]] = [{} for _ in rounds]
        for s in self.steps:
            many = getattr(s, "update_runs", None)
            olds = [state.get(s.name, {}) for state in states]
            rounds, stepped = many(rounds, olds) if many is not None else _each(s, rounds, olds)
            for new, st in zip(new_states, stepped, strict=True):
                if st:
                    new[s.name] = st
        for r, new in zip(rounds, new_states, strict=True):
            if r.weights is not None:
                new[DECIDED] = {"round": r.round, "clients": list(r.upload.client_ids), "weights": r.weights}
        return [(_combined(r), new) for r, new in zip(rounds, new_states, strict=True)]
