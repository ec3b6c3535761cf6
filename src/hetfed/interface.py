"""The algorithm interface: a few pure functions over explicit state.

This module sits between the engine (which runs algorithms) and the algorithms
(which use engine helpers such as ``train_stack``): both import it, it imports
neither, so the imports go one way.

An algorithm never knows which executor runs it. Every client-side step
receives a *stack* of clients (one client, a chunk, or all of them) and returns
per-client results; the executors decide how to stack and where the clients
live (in this process, or on Flower SuperNodes):

- ``local_update(broadcast, states, data) -> (Upload, states)`` — a round's training;
- ``personalise(broadcast, states, data) -> (states, info)`` — optional client-side
  work after federated training (FedMoE's fine-tuning and mixture); nothing of it
  leaves the client except the per-client ``info`` metrics (epochs, seconds);
- ``evaluate_client(broadcast, states, data, view) -> metrics`` — the client's model
  on its own validation/test data; only metrics leave the client.

The server side: ``server_init``, ``broadcast``, ``aggregate`` (through :func:`server_step`, the server
chain), ``evaluate_server`` (the server's model on the balanced global test set), and optionally
``select_clients`` and ``bind``; ``predictor`` says what a client predicts with, ``personal_plan`` who takes
part in personalisation. What an algorithm *is* (name, parameters, :class:`Capabilities`) is data in its
registered spec. Everything random comes from generators derived from the run seed.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeGuard, cast, runtime_checkable

import numpy as np
import torch

from hetfed.config import PrivacyConfig, TrainConfig
from hetfed.engine.evaluate import ClientEvalData, Predictor, auc, client_scores, scores, scores_of, stacked_score_sums
from hetfed.engine.local import LocalSchedule
from hetfed.engine.root import root_model
from hetfed.engine.types import (
    Broadcast,
    ClientData,
    ClientState,
    Params,
    ServerState,
    Upload,
    map_tensors,
    split_state,
)
from hetfed.errors import ConfigError
from hetfed.models.base import Model

__all__ = [
    "Algorithm", "Broadcast", "Capabilities", "ClientData", "ClientEvalData", "ClientState", "Context", "Params",
    "Predictor",
    "ServerState", "Upload", "client_scores",
]


#: the key of :meth:`Algorithm.findings` that holds a clustered method's cluster of each uploading client
CLUSTERS = "clusters"

#: what an algorithm may do with a model's buffers (``Capabilities.buffers``)
BUFFER_HANDLING = ("aggregated", "local", "reset")


@dataclass(frozen=True)
class Capabilities:
    """What an algorithm does that the rest of hetfed must know — declared in its registry entry
    (:mod:`hetfed.algorithms.registry`), never inferred from its name.

    uploads: in words, what leaves a client each round (the privacy table of docs/methods.md).
    private: DP-FedAvg can privatise it: the uploads are only shared parameters (+ the training loss).
    server_data: the server needs unlabeled data of its own (``server_data.*``).
    whole_round: the server needs every update of a round at once (no streaming aggregation).
    server_model: the server holds a model: the server pipeline (robust combine, DP, server optimiser) applies.
    views: named predictors the clients evaluate after personalisation (empty: only the model).
    federated_view: which view is the federated phase's model.
    primary_view: which view is the method's headline result (None: the federated model).
    personalises: each client ends with a model of its own.
    model_kinds: the model kinds it supports (None: every kind).
    model_reason: why other kinds are refused (the error message's reason).
    stacks_runs: its client step and its clients' evaluation read the broadcast only through ``bc.stacked(n)``,
        ``bc.extra_rows(key, n)`` (a tensor extra, each client its own run's), ``bc.personal``'s rows, the numbers
        among ``bc.extra``, the parameters' names, ``Proximal`` centres and ``bc.lr``, keep nothing of one run on the
        algorithm object that the step reads, and its evaluation reads the global test set only
        through ``client_scores`` (``ClientEvalData.global_index``), so clients of different runs (other global
        models) can share a stack (a stacked sweep: :mod:`hetfed.executors.stacked_runs`).
    asynchronous: its server merges arrivals as they come on the simulated clock (``merge``, FedBuff and FedAsync:
        :mod:`hetfed.executors.asynchronous` drives it instead of synchronous rounds).
    per_client: its server keeps something for each client (a model, a head, a hypernetwork's output) and sends each
        client only its own row (:attr:`hetfed.engine.types.Broadcast.personal`): server memory grows with the
        federation (docs/scale.md), and a run saves each client's row beside its model (:func:`served`).
    whole_model: its server chain combines the method's model itself, every shared parameter of one model under
        the model's names (IFCA's and CFL's: one cluster's at a time). False: part of one, the rest staying on the
        clients (a body without its head, LG-FedAvg's head, Floco's simplex), or several under names of their own
        (FedEM's components) — a combine rule that trains the server's model on data of its own (FLTrust's root
        set) cannot, and is refused.
    buffers: what happens to a model's buffers (batch norm's running statistics) of its shared part: ``aggregated``
        (uploaded and combined with the parameters, FedAvg), ``local`` (each client keeps its own, FedBN), or
        ``reset`` (they start afresh each round). Tested against each method's real upload with a batch-norm CNN.
    plain_steps: its clients train with :func:`hetfed.engine.local.train_stack`'s plain step (the model's
        cross-entropy, at most a ``Proximal`` term; no objective, term or projection of its own), which computes
        only the clients of a stack that still train: the executor stacks a round's clients longest plan first in
        stacks as large as memory allows, instead of grouping them by plan length
        (:func:`hetfed.engine.stacks.stack_blocks`). Only the stacking follows it: a step that is not plain after
        all still gives its numbers. DP-SGD (``privacy.record``) is admitted only for these.
    compact_steps: its steps compute only the clients still training without being plain: a loss of its own that
        declares its per-client tensors (:class:`hetfed.engine.local.StackObjective`, FedRoD's class counts) or a
        :class:`hetfed.engine.local.Proximal` term with a shift (SCAFFOLD's correction). The executor stacks it as a
        plain one; DP-SGD, which clips the cross-entropy, stays refused. (APFL's and pFedMe's steps compute only the
        clients still training too, but they do not declare it: in one stack they were slower on a CPU.)
    reports: the server extra that holds the model the method reports in place of its last state (Agnostic FL's mean
        of its iterates; :func:`reported`): the global test set scores it, a run saves it, and the broadcast carries
        it for the clients to score. None, or the extra absent: the server's parameters.
    """

    uploads: str = "shared parameters, sample count, training loss"
    private: bool = False
    server_data: bool = False
    whole_round: bool = False
    server_model: bool = True
    views: tuple[str, ...] = ()
    federated_view: str = "fedavg"
    primary_view: str | None = None
    personalises: bool = False
    model_kinds: tuple[str, ...] | None = None
    model_reason: str = ""
    stacks_runs: bool = False
    asynchronous: bool = False
    per_client: bool = False
    whole_model: bool = True
    buffers: str = "aggregated"
    plain_steps: bool = False
    compact_steps: bool = False
    reports: str | None = None

    def __post_init__(self) -> None:
        if self.buffers not in BUFFER_HANDLING:
            raise ValueError(f"Capabilities.buffers = {self.buffers!r}; expected one of {', '.join(BUFFER_HANDLING)}")


@dataclass(frozen=True, eq=False)
class Context:
    """What an algorithm is built with besides its model, schedule and parameters.

    pipeline: the server chain (:class:`hetfed.server.chain.Chain`: screen spec, combine or DP-FedAvg's
    noised mean, server optimiser), built from ``server.*`` and ``privacy`` by
    :func:`hetfed.algorithms.build_algorithm`; seed: the run seed (for per-client phases
    that draw from it); in_features: the flattened input size (a server model that
    decodes to inputs, Fed-FSNet's); build: a model of the same kind with n outputs
    (FedMoE's gate).
    """

    pipeline: Any = None
    seed: int = 0
    in_features: int | None = None
    build: Callable[[int], Model] | None = None
    #: client-level differential privacy (``privacy.*``; None or noise_multiplier None: off)
    privacy: PrivacyConfig | None = None
    #: the privacy section when record-level DP is on in the local steps (``privacy.record``, DP-SGD; None: off)
    records: PrivacyConfig | None = None


@dataclass(frozen=True)
class PersonalPlan:
    """The personalisation phase of a method with one: ``clients`` run ``personalise``, ``scored`` report every
    view's metrics (None: every client), ``model`` and ``batch_size`` are what it trains (the executor's
    memory budget)."""

    clients: list[int]
    scored: list[int] | None
    model: Model
    batch_size: int


class Algorithm:
    """Base class with FedAvg's server side; subclasses change what they need.

    What an algorithm *is* (its name, parameters, capabilities) is its registered
    :class:`~hetfed.algorithms.registry.AlgorithmSpec` (``spec``, set by ``register``);
    the class holds only behaviour.
    """

    #: set by :func:`hetfed.algorithms.registry.register`: name, parameters, capabilities
    spec: Any = None

    def __init__(self, model: Model, train: TrainConfig, params=None, context: Context | None = None):
        self.model = model
        self.train = train
        self.params = params if params is not None or self.spec is None else self.spec.make_params(None)
        self.context = context or Context()
        self.schedule = LocalSchedule.from_train(train, self.context.records.record if self.context.records else None)
        self._seed = 0
        self._expected_clients = 1
        self._clients = 0  # the federation's size, once bound (servers that hold something per client)
        #: the server's labelled root set (inputs, labels), once bound, where its combine rule trains on one
        self._root: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def capabilities(self) -> Capabilities:
        return self.spec.capabilities if self.spec is not None else Capabilities()

    # -- server side
    def bind(self, fed, seed: int = 0, per_round: int = 1) -> None:
        """Learn what the server may know before round 1: the federation (its size), the run seed and
        how many clients a round samples (``per_round``: DP's fixed denominator).

        Subclasses that learn more call this first.
        """
        self._seed = seed
        self._expected_clients = max(1, per_round)
        self._clients = int(fed.n_clients)
        rule = self.context.pipeline.root_rule if self.context.pipeline is not None else None
        if rule is not None:
            where = f"methods.*.server.combine.rule = {rule!r}"
            if not self.capabilities.whole_model:
                raise ConfigError(f"{where} is not allowed with methods.*.algorithm = {self.spec.name!r}: its server "
                                  "holds part of the model or several, which a root set cannot train; expected a "
                                  "method whose server holds the whole model")
            if getattr(fed, "server_y", None) is None:
                raise ConfigError(f"{where} trains on a labelled root set but this federation's server holds none: "
                                  "expected server_data.source 'auto' or 'holdout'")
            self._root = (torch.as_tensor(fed.server_x, dtype=torch.float32), torch.as_tensor(fed.server_y).long())

    def server_init(self, gen: torch.Generator) -> ServerState:
        return ServerState(params=self.model.init_shared(gen))

    def select_clients(self, state: ServerState, eligible: np.ndarray, m: int,
                       rng: np.random.Generator) -> list[int] | None:
        """The round's m clients among the ``eligible`` ids, when the method chooses them (AFL);
        None: the engine's uniform sampling. ``rng`` is the round's sampling stream."""
        return None

    def broadcast(self, state: ServerState, round: int) -> Broadcast:
        """The server's parameters (and the model it reports, where that is another: ``Capabilities.reports``)."""
        key = self.capabilities.reports
        extra = {key: state.extra[key]} if key is not None and key in state.extra else {}
        return Broadcast(params=state.params, round=round, lr=round_lr(self.train, round), extra=extra)

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        """FedAvg: the server pipeline (sample-weighted mean, or the configured robust / private rule, then
        the server optimiser)."""
        params, extra = server_step(self, state, upload)
        return ServerState(params=params, round=state.round + 1, extra=extra)

    def findings(self, state: ServerState, upload: Upload) -> Mapping[str, float | torch.Tensor]:
        """What the server's step ``state`` on ``upload`` found that a user studies, written to the round's metrics
        (``train`` rows) and, the last round's, to the run's summary (``findings``): numbers (Agnostic FL's λ, CFL's
        update norms); a 1-D tensor with one value a client of the federation, by client id (Agnostic FL's
        ``lambda``), is what it found of each client: a ``train`` row a client, and the summary's
        ``client_findings``; and under :data:`CLUSTERS` a clustered method's cluster of each of ``upload``'s clients
        (a tensor: the loop counts the clusters and scores them against the clients' concepts). {}: nothing."""
        return {}

    @torch.no_grad()
    def evaluate_server(self, state: ServerState, x_global: torch.Tensor, y_global: torch.Tensor) -> dict[str, float]:
        """The server's model on the balanced global test set (local parameters as for an unseen client)."""
        if not self.capabilities.server_model:
            return {}
        return server_metrics(self, self.model.forward(global_params(self, reported(self, state)),
                                                       x_global.unsqueeze(0), None)[0], y_global)

    # -- client side
    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        return self.model.init_local(gen)

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        raise NotImplementedError

    def personalise(self, bc: Broadcast, states: ClientState,
                    data: ClientData) -> tuple[ClientState, dict[str, torch.Tensor]]:
        """Client-side work after federated training; returns new states and per-client info metrics."""
        return states, {}

    def private_steps(self, n: int) -> int:
        """The local steps over its data a client of ``n`` samples takes in a round (each a DP-SGD step under
        ``privacy.record``, which its ε composes): one pass of the schedule; a method that trains more on the data in
        a round (Ditto's personal model) counts those too."""
        return self.schedule.n_steps(n)

    def personal_plan(self, fed: Any, seed: int) -> PersonalPlan:
        """Who runs :meth:`personalise`, who reports the views' metrics, and what it trains (for the executor's
        memory budget); by default every client, with the method's model and batch size."""
        return PersonalPlan(list(range(fed.n_clients)), None, self.model, self.schedule.batch_size)

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """What each of ``n`` stacked clients predicts with (``view``: one of :attr:`views`): the model the server
        reports (``Capabilities.reports``, where the broadcast carries it; a saved run's model is that already)."""
        key = self.capabilities.reports
        shared = bc.extra_rows(key, n) if key is not None and bc.has_extra(key) else bc.stacked(n)
        local, _ = split_state(states)
        return Predictor(self.model, {**shared, **local}, own_parameters(self))

    @torch.no_grad()
    def evaluate_client(self, bc: Broadcast, states: ClientState, data: ClientEvalData,
                        view: str | None = None) -> dict[str, list[float]]:
        """Each client's model on its own test and validation sets (and, if personal, the global test set): the one
        it fits to its data first where the method has clients do so (:class:`FitsToData`)."""
        return client_scores(client_predictor(self, bc, states, len(data.client_ids), lambda: data, view), data)


@runtime_checkable
class PredictsWithLess(Protocol):
    """What a method adds whose broadcast carries what its clients train with and do not predict with (FedFomo's
    candidate models, M for each client): the part they predict with, which a saved run keeps (:func:`served`)."""

    def predicting(self, bc: Broadcast) -> Broadcast:
        """``bc`` without what the clients' prediction does not read."""
        ...


@runtime_checkable
class FitsToData(Protocol):
    """What a method adds, beyond :class:`Algorithm`'s functions, whose clients fit the model they predict with to
    their own data whenever they evaluate (kNN-Per's datastore, Per-FedAvg's step, pFedFDA's statistics, IFCA's and
    CFL's choice of cluster): that predictor, from the data. :meth:`Algorithm.evaluate_client` scores it; a saved
    run's client predictions build it from the client's own rows (:mod:`hetfed.api`)."""

    def fitted_predictor(self, bc: Broadcast, states: ClientState, data: ClientEvalData,
                         view: str | None = None) -> Predictor:
        """What each client of ``data`` predicts with, fitted to its rows of ``data`` (``data.train``, its training
        indices, or ``data.val``); without its training rows (``data.train`` None), what it can."""
        ...


def fits_to_data(algo: object) -> TypeGuard[FitsToData]:
    """Whether ``algo`` is a :class:`FitsToData`, by its class (``isinstance`` of a Protocol: 7 µs a stack)."""
    return hasattr(type(algo), "fitted_predictor")


def client_predictor(algo: Algorithm, bc: Broadcast, states: ClientState, n: int,
                     data: Callable[[], ClientEvalData], view: str | None = None) -> Predictor:
    """What ``n`` stacked clients predict with — fitted to their rows (``data()``, read only then) where the method
    fits it — for an evaluation, a membership attack and a saved run's client predictions alike."""
    if fits_to_data(algo):
        return algo.fitted_predictor(bc, states, data(), view)
    return algo.predictor(bc, states, n, view)


@runtime_checkable
class AggregatesRuns(Protocol):
    """What a method adds, beyond :class:`Algorithm`'s functions, to aggregate several runs in one call: a stacked
    sweep groups its runs' aggregations by :meth:`aggregate_key` and hands each group to :meth:`aggregate_runs`. For a
    server that does much per run (FedGen's generator, Fed-FSNet's hidden model, FedDF's student, pFedHN's and
    pFedLA's hypernetworks), computed along a run axis instead of once a run. Optional: a method without it aggregates
    each run alone, with the same numbers."""

    def aggregate_key(self, state: ServerState, upload: Upload) -> Hashable:
        """What must be equal, besides the method's parameters and the model (a stacked sweep compares those), for
        runs to aggregate in one call: devices, how many clients answered."""
        ...

    @classmethod
    def aggregate_runs(cls, algos: Sequence[Any], states: Sequence[ServerState],
                       uploads: Sequence[Upload]) -> list[ServerState]:
        """Each run's :meth:`Algorithm.aggregate`, in one call: every run's new state as alone."""
        ...


def aggregates_runs(algo: object) -> TypeGuard[AggregatesRuns]:
    """Whether a method is :class:`AggregatesRuns`, asked of its class once (a protocol's ``isinstance`` took ~30 µs,
    asked of every run of a stacked sweep at every round)."""
    kind: Any = type(algo)
    return _aggregates_runs(kind)


@functools.cache
def _aggregates_runs(method: Any) -> bool:
    return all(callable(getattr(method, name, None)) for name in ("aggregate_key", "aggregate_runs"))


def aggregate_key(algo: Algorithm, state: ServerState, upload: Upload) -> Hashable | None:
    """What must be equal for runs of ``algo``'s method to aggregate in one call (:func:`aggregate_runs`; a stacked
    sweep's): the method's own key (:class:`AggregatesRuns`), or for a method whose server is the chain alone
    (:meth:`Algorithm.aggregate`: FedAvg, FedProx, Ditto …) its chain's identity; None: it aggregates alone."""
    if aggregates_runs(algo):
        return ("own", algo.aggregate_key(state, upload))
    if type(algo).aggregate is Algorithm.aggregate:
        return ("server chain", _chain(algo).identity)
    return None


def aggregate_runs(algos: Sequence[Algorithm], states: Sequence[ServerState],
                   uploads: Sequence[Upload]) -> list[ServerState]:
    """Each run's ``aggregate`` in one call, for runs of equal :func:`aggregate_key`: the method's own
    ``aggregate_runs``, or the server chain stepped along the run axis (:func:`chain_aggregates`)."""
    first = algos[0]
    if aggregates_runs(first):
        return first.aggregate_runs(algos, states, uploads)
    return chain_aggregates(algos, states, uploads)


def chain_aggregates(algos: Sequence[Algorithm], states: Sequence[ServerState],
                     uploads: Sequence[Upload]) -> list[ServerState]:
    """:meth:`Algorithm.aggregate` of several runs of one server chain (:func:`server_steps`): every run's state as
    alone."""
    return [ServerState(params=params, round=state.round + 1, extra=extra)
            for (params, extra), state in zip(server_steps(algos, states, uploads), states, strict=True)]


@runtime_checkable
class ReportsMore(Protocol):
    """What a method adds whose server's model is more than its parameters (FLoRA's: the base's, with the merged
    updates its state keeps as an extra): that model, which the server scores and a run saves (:func:`reported`)."""

    def reported_state(self, state: ServerState) -> ServerState:
        """``state`` with the whole model as its parameters."""
        ...


def reported(algo: Algorithm, state: ServerState) -> ServerState:
    """The server's model as the method reports it: the method's own (:class:`ReportsMore`), the state itself, or
    the state with the extra that holds it as its parameters (``Capabilities.reports``)."""
    if hasattr(type(algo), "reported_state"):  # a ReportsMore (isinstance of a Protocol: 7 µs a run a round)
        return cast(ReportsMore, algo).reported_state(state)
    key = algo.capabilities.reports
    return replace(state, params=state.extra[key]) if key is not None and key in state.extra else state


def served(algo: Algorithm, state: ServerState) -> dict[str, Any] | None:
    """What the clients of ``state``'s broadcast predict with besides the server's model, as a saved run keeps it
    beside that model (:func:`broadcast_of` rebuilds the broadcast): its tensor extras (FedProto's prototypes) and
    each client's row (``Broadcast.personal``: FedFomo's models, pFedHN's generated ones, FedCAC's customised
    ones). None for a method whose clients score the model sent (:func:`scores_the_broadcast`) or that sends no
    more than its model and keeps no row per client."""
    if scores_the_broadcast(algo):
        return None
    bc = algo.broadcast(state, state.round)
    if isinstance(algo, PredictsWithLess):
        bc = algo.predicting(bc)
    extra = {k: map_tensors(v, lambda t: t.detach().cpu()) for k, v in bc.extra.items()
             if k != algo.capabilities.reports and _tensors(v)}
    if not extra and not bc.personal and not algo.capabilities.per_client:  # a per-client server's always: its
        return None  # absence says the run was saved before hetfed kept it (Floco's rows start at round τ)
    return {"round": bc.round, "extra": extra, "personal": {k: v.detach().cpu() for k, v in bc.personal.items()},
            "personal_ids": None if bc.personal_ids is None else list(bc.personal_ids)}


def _tensors(value: Any) -> bool:
    return isinstance(value, torch.Tensor) or (
        isinstance(value, dict) and bool(value) and all(isinstance(v, torch.Tensor) for v in value.values()))


def broadcast_of(shared: Params, kept: dict[str, Any] | None) -> Broadcast:
    """The broadcast a saved run's clients predict from: its model ``shared`` and what :func:`served` kept."""
    if not kept:
        return Broadcast(shared, 0, 0.0)
    ids = kept["personal_ids"]
    return Broadcast(shared, int(kept["round"]), 0.0, dict(kept["extra"]), dict(kept["personal"]),
                     None if ids is None else tuple(ids))


def global_params(algo: Algorithm, state: ServerState) -> Params:
    """Stacked (n = 1) params of the server's model, for the global test set.

    Local parameters take their value for a client never seen in training.
    """
    unseen = algo.model.local_for_unseen_client(_device(state.params))
    return {k: v.unsqueeze(0) for k, v in {**state.params, **unseen}.items()}


def server_metrics(algo: Algorithm, logits: torch.Tensor, y: torch.Tensor,
                   s: dict[str, float] | None = None) -> dict[str, float]:
    """What :meth:`Algorithm.evaluate_server` reports of the server's model's ``logits`` on the global test set
    (``s``: their :func:`~hetfed.engine.evaluate.scores`, when read already)."""
    s = scores(logits, y) if s is None else s
    key = "server" if own_parameters(algo) else "global"
    out = {f"{key}_accuracy": s["accuracy"], f"{key}_loss": s["loss"]}
    if algo.model.n_classes == 2:
        out[f"{key}_auc"] = auc(y.cpu().numpy(), logits.softmax(-1)[:, 1].cpu().numpy())
    return out


def step_identity(algo: Algorithm) -> tuple[Any, ...]:
    """What makes ``algo``'s client step one computation with another method's, besides the model, the schedule and
    the optimiser (:meth:`~hetfed.run_spec.RunSpec.step_identity`): the step a method declares it runs unchanged
    (``shared_step()``: FedAvg's, which reads none of the method's parameters — kNN-Per's, FedMoE's, FedDF's clients
    train with it), so a stacked sweep's runs of those methods train in one stack; otherwise the method itself, its
    name and parameters (FedProx's μ is in its step)."""
    shared = getattr(algo, "shared_step", None)
    step = shared() if callable(shared) else None
    return ("step", step) if step is not None else method_identity(algo)


def method_identity(algo: Algorithm) -> tuple[str, str]:
    """The method as a computation: its registered name (its class's, for one not registered) and parameters."""
    params = algo.params.model_dump_json() if hasattr(algo.params, "model_dump_json") else repr(algo.params)
    return algo.spec.name if algo.spec is not None else type(algo).__name__, params


def scores_servers_together(algo: Algorithm) -> bool:
    """Whether runs of ``algo``'s method may score their servers' models in one forward (:func:`evaluate_servers`):
    its server holds a model, scored the base way (a method that scores its server its own way — a mixture, a
    cluster's model — scores it alone)."""
    return algo.capabilities.server_model and type(algo).evaluate_server is Algorithm.evaluate_server


@torch.no_grad()
def evaluate_servers(algos: Sequence[Algorithm], states: Sequence[ServerState], x: torch.Tensor,
                     ys: Sequence[torch.Tensor]) -> list[dict[str, float]]:
    """:meth:`Algorithm.evaluate_server` of runs of one network (:func:`scores_servers_together`; the methods may
    differ: each run's model is the one its method reports), in one stacked forward: ``x`` ``[runs, N, ...]`` each
    run's global test set, ``ys`` its labels. A stacked model's row is its own computation, so each run gets its
    numbers alone (a stacked sweep's runs: :mod:`hetfed.executors.stacked_runs`)."""
    params = [{**reported(a, s).params, **a.model.local_for_unseen_client(_device(s.params))}  # global_params's
              for a, s in zip(algos, states, strict=True)]
    logits = algos[0].model.forward({k: torch.stack([p[k] for p in params]) for k in params[0]}, x, None)
    if not len(ys[0]):  # an empty global test set: nothing to read back (its scores say so)
        return [server_metrics(a, lg, y) for a, lg, y in zip(algos, logits, ys, strict=True)]
    # each run's sums as alone, read back from the device once for all (a read each made a GPU wait as often)
    sums = stacked_score_sums(logits, torch.stack(list(ys))).tolist()
    return [server_metrics(a, lg, y, scores_of(loss, correct, len(y)))
            for a, lg, y, (loss, correct) in zip(algos, logits, ys, sums, strict=True)]


def server_step(algo: Algorithm, state: ServerState, upload: Upload,
                scale: float = 1.0) -> tuple[Params, dict[str, Any]]:
    """The server pipeline on a round's updates: ``(new shared params, server extra)`` — what an algorithm's
    ``aggregate`` calls.

    The method's server chain (:mod:`hetfed.server.chain`: combine, or DP-FedAvg's noised mean under
    ``privacy``, then the server optimiser on the pseudo-gradient). Every algorithm whose server holds
    a model calls this, so robust rules, DP and server optimisers serve all of them alike. The chain's
    state goes into the returned extra (and so into checkpoints). ``scale`` multiplies the
    pseudo-gradient before the optimiser (FedNova's τ_eff).
    """
    return server_steps([algo], [state], [upload], [scale])[0]


def server_steps(algos: Sequence[Algorithm], states: Sequence[ServerState], uploads: Sequence[Upload],
                 scales: Sequence[float] | None = None) -> list[tuple[Params, dict[str, Any]]]:
    """:func:`server_step` of several runs of one server chain (the first run's; a stacked sweep's runs), in one
    :meth:`~hetfed.server.chain.Chain.step_runs`: each run's result as alone."""
    chain = _chain(algos[0])
    rounds = [chain.round_of(state.params, upload, round=state.round, seed=algo._seed,
                             expected_clients=algo._expected_clients, scale=scale, root=_root(algo, state, chain))
              for algo, state, upload, scale in zip(algos, states, uploads, scales or [1.0] * len(algos), strict=True)]
    stepped = chain.step_runs(rounds, [chain.state_of(state.extra) for state in states])
    out = []
    for state, (params, chain_state) in zip(states, stepped, strict=True):
        extra = {k: v for k, v in state.extra.items() if k != chain.LEGACY_STATE}
        if chain_state:
            extra[chain.STATE] = chain_state
        out.append((params, extra))
    return out


def _chain(algo: Algorithm) -> Any:
    """The method's server chain (:class:`hetfed.server.chain.Chain`, a layer above: read by its functions)."""
    chain = algo.context.pipeline
    if chain is None:
        raise RuntimeError(f"{algo.spec.name if algo.spec else type(algo).__name__}: no server chain; build algorithms "
                           "with hetfed.algorithms.build_algorithm (or pass context=Context(pipeline=…))")
    return chain


def _root(algo: Algorithm, state: ServerState, chain: Any) -> Params | None:
    """The server's model trained on its root set from the round's model, where the chain's rule reads it."""
    if chain.root_rule is None:
        return None
    if algo._root is None:
        raise RuntimeError("the server chain trains on a root set: bind() the federation first")
    return root_model(algo.model, state.params, *algo._root, LocalSchedule.from_train(algo.train),
                      algo.train.optimizer, round_lr(algo.train, state.round), algo._seed, state.round)


def round_lr(train: TrainConfig, round: int) -> float:
    """The clients' learning rate in round ``round`` (counted from 0): ``train.optimizer.lr`` decayed by
    ``train.lr_decay`` each round."""
    return train.optimizer.lr * train.lr_decay**round


def private(algo: Algorithm) -> PrivacyConfig | None:
    """The method's client-level DP settings when DP-FedAvg is on (``privacy.noise_multiplier`` set), else None."""
    privacy = algo.context.privacy
    return privacy if privacy is not None and privacy.noise_multiplier is not None else None


def scores_the_broadcast(algo: Algorithm) -> bool:
    """Whether ``algo``'s clients are scored with the model its server sends (or the one it reports), the base way:
    the method neither evaluates nor predicts its own way, and its clients have no parameters of their own — so what
    it scores is a function of that model, the clients' data and whichever of the model's own names the clients hold
    in their states (FFA-LoRA's frozen A), not of the method or the clients' other states (SCAFFOLD's control
    variates)."""
    kind = type(algo)
    return (kind.evaluate_client is Algorithm.evaluate_client and kind.predictor is Algorithm.predictor
            and not own_parameters(algo) and not fits_to_data(algo))


def own_parameters(algo: Algorithm) -> bool:
    """Whether the clients predict with parameters of their own: the model has local parameters (CGAU's rows,
    FedBN's statistics), or the method declares it personalises without named views (each client ends with a
    model of its own: Ditto, FedPer, IFCA …; FedMoE's and FedBABU's views are predictors of their own)."""
    caps = algo.capabilities
    return bool(algo.model.local_names) or (caps.personalises and not caps.views)


def _device(params: Params) -> torch.device:
    return next(iter(params.values())).device if params else torch.device("cpu")
