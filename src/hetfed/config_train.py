"""The schedule's sections: rounds, client sampling, local work, evaluation, the client optimiser and the clocks
(``train.*``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from hetfed.config_base import Chosen, Strict
from hetfed.config_io import get_dotted
from hetfed.errors import ConfigError
from hetfed.registry import registry_of
from hetfed.spelling import did_you_mean


class OptimizerConfig(Strict):
    """The client optimiser. ``reset_each_round: false`` keeps its state on the client."""

    #: ``adam`` adds ``weight_decay · θ`` to the gradient (``torch.optim.Adam``); ``adamw`` shrinks θ by
    #: ``lr · weight_decay`` apart from it (``torch.optim.AdamW``)
    kind: Literal["sgd", "adam", "adamw"] = "sgd"
    lr: float = Field(0.1, gt=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    reset_each_round: bool = True

    #: the keys only some kinds read (SGD's momentum; Adam's moments), by kind; every other key is read by all
    READS: ClassVar[dict[str, tuple[str, ...]]] = {"sgd": ("momentum",), "adam": ("betas", "eps"),
                                                   "adamw": ("betas", "eps")}

    def unread(self, typed: Iterable[str] | None = None) -> dict[str, tuple[Any, str]]:
        """The keys meant for another kind: those this kind does not read among ``typed`` (the keys a user gave it,
        where that is known: an optimiser among an algorithm's parameters) or else set away from their default."""
        others = sorted({k for keys in self.READS.values() for k in keys} - set(self.READS[self.kind]))
        given = {k: getattr(self, k) for k in others if k in typed} if typed is not None else \
            self.away_from_default(*others)
        return {k: (v, f"its optimiser kind {self.kind!r} has no {k!r}") for k, v in given.items()}


def unread_method_keys(method: Any, i: int, section: str, values: Strict) -> dict[str, tuple[Any, str]]:
    """A note per key of the ``i``-th method's ``section`` as it runs with it (``values``) that it does not read
    (:meth:`Strict.unread`; a key the method set itself named as its own) and, for ``train``, per key of an
    optimiser among its algorithm's parameters that its kind does not have (FedMoE's ``params.optimizer``: the keys
    given there), as ``where → (value, why)``: a top-level key (``train.chunk_clients``) may be noted for several
    methods, whose notes the caller joins. ``method``: a ``MethodConfig``."""
    found = [(f"{'' if get_dotted(getattr(method, section), key) is None else f'methods.{i}.'}{section}.{key}", value,
              why) for key, (value, why) in values.unread().items()]
    with contextlib.suppress(ConfigError):  # invalid parameters are the plan's to refuse, in its words
        params = registry_of("algorithm").get(method.algorithm).make_params(method.params, f"methods.{i}.params") \
            if section == "train" else ()
        for name, opt in params:
            given = method.params.get(name)  # as the user gave it: a mapping of keys, or an OptimizerConfig (the API)
            if isinstance(opt, OptimizerConfig) and given is not None:
                typed = given.model_fields_set if isinstance(given, OptimizerConfig) else set(given)
                found += [(f"methods.{i}.params.{name}.{key}", value, why)
                          for key, (value, why) in opt.unread(typed).items()]
    return {where: (value, why) for where, value, why in found}


def joined_notes(found: list[tuple[str, dict[str, tuple[Any, str]]]]) -> dict[str, str]:
    """The methods' notes (each method's label and :func:`unread_method_keys`), one a key: a top-level key that
    several methods do not read names every one of them (``by methods 'relu', 'cgau'``)."""
    by: dict[str, tuple[Any, dict[str, list[str]]]] = {}  # where → (value, why → the labels)
    for label, notes in found:
        for where, (value, why) in notes.items():
            by.setdefault(where, (value, {}))[1].setdefault(why, []).append(repr(label))
    return {where: f"{where} = {value!r} is not read by " + "; by ".join(
        f"method{'s' if len(labels) > 1 else ''} {', '.join(labels)}: {why}" for why, labels in whys.items())
        for where, (value, whys) in by.items()}


class StragglerConfig(Strict):
    """Slow clients and a round deadline: a client whose round takes longer than ``deadline`` is dropped.

    Each client gets a fixed time per local step, drawn once from the run seed
    (median 1: the deadline is in "median client steps"); a round takes
    ``steps × time_per_step``.
    """

    distribution: Literal["none", "lognormal", "exponential", "uniform"] = "none"
    spread: float = Field(0.5, gt=0, description="lognormal σ; uniform: times in [1 − spread/2, 1 + spread/2]·median")
    deadline: float | None = Field(None, gt=0, description="time units (median client steps); None: no deadline")


class ClockConfig(Chosen):
    """Simulated time (hetfed.engine.clock): a client's round takes its compute time (samples processed × its
    seconds per sample) plus its network time (bytes received ÷ downlink + bytes sent ÷ uplink); a synchronous
    round lasts as long as its slowest aggregated client (or the deadline, when a client missed it). Each client's
    speeds are drawn once from the run seed by the latency model (median ``sample_seconds``), or read from a file;
    a model's own keys sit beside it (lognormal, uniform: ``spread``; file: ``file``; `hetfed components latency`)."""

    chosen_by: ClassVar[tuple[str, str]] = ("latency", "latency")

    latency: str = Field(
        "constant", description="each client's seconds per sample: all the median (constant), drawn once per client "
        "from a distribution with that median (lognormal, exponential, uniform), or read from a file; wall: no "
        "model, on an executor whose clients are elsewhere (Flower) — a round lasts its training exchange's real "
        "seconds, an asynchronous server merges replies in the order they really come; a federation of nodes with "
        "their own data is always timed so (the server does not know their clients' sizes)")
    sample_seconds: float = Field(1e-3, gt=0, description="the median client's seconds to train on one sample")
    uplink_mbps: float | None = Field(None, gt=0, description="the median client's upload bandwidth in Mbit/s "
                                      "(None: sending takes no time)")
    downlink_mbps: float | None = Field(None, gt=0, description="the median client's download bandwidth in Mbit/s "
                                        "(None: receiving takes no time)")
    network_spread: float = Field(0.0, ge=0, description="lognormal σ of each client's bandwidths around the median")
    slow: Literal["random", "by_label"] = Field(
        "random", description="which client gets which speed: random, or by_label (clients sorted by their most "
        "frequent class; the slowest speeds go to the highest classes, so slow clients hold different classes)")
    deadline: float | None = Field(None, gt=0, description="seconds: a client whose round takes longer is dropped "
                                   "(late); the round then lasts the deadline")

    def unread(self) -> dict[str, tuple[Any, str]]:
        """The speeds' keys where a file gives every client's speeds, or where none is modelled (``wall``: real
        exchanges); the bandwidths' spread without a bandwidth."""
        model = registry_of("latency").get(self.latency)
        if model.reads_file or model.wall:
            why = (f"train.clock.latency = {self.latency!r} " + ("times the clients' real exchanges" if model.wall
                                                                 else "reads every client's speeds from its file"))
            keys: tuple[str, ...] = ("sample_seconds", "uplink_mbps", "downlink_mbps", "network_spread", "slow")
        else:
            why = "no bandwidth is set (uplink_mbps, downlink_mbps): sending and receiving take no time"
            keys = ("network_spread",) if self.uplink_mbps is None and self.downlink_mbps is None else ()
        return {k: (v, why) for k, v in self.away_from_default(*keys).items()}


#: ``train.checkpoint_every: auto``: a checkpoint every this many rounds, once this many seconds have passed since the
#: last one (or the loop's start) — a long run of quick rounds (hundreds a minute on a GPU) writes one a minute, not
#: its client states every tenth of a second; a run shorter than a minute, only its final one
AUTO_CHECKPOINT_ROUNDS, AUTO_CHECKPOINT_SECONDS = 10, 60.0


def checkpoint_due(every: int | str | None, rnd: int, since_last: float) -> bool:
    """Whether round ``rnd``'s end is a checkpoint under ``train.checkpoint_every`` = ``every``, ``since_last``
    seconds after the last checkpoint (or the loop's start); the end of a phase always is (the loop's)."""
    if every == "auto":
        return rnd % AUTO_CHECKPOINT_ROUNDS == 0 and since_last >= AUTO_CHECKPOINT_SECONDS
    return isinstance(every, int) and rnd % every == 0


class TrainConfig(Strict):
    """The federated schedule: rounds, client sampling, local work, evaluation."""

    rounds: int = Field(100, ge=1)
    client_fraction: float | None = Field(
        1.0, gt=0, le=1, description="C: share of the opted-in clients sampled per round"
    )
    clients_per_round: int | None = Field(
        None, ge=1, description="m: a fixed count per round (wins over client_fraction)"
    )
    local_epochs: float | None = Field(1.0, gt=0)
    local_steps: int | None = Field(None, ge=1, description="τ: wins over local_epochs")
    steps_cap_one_pass: bool = Field(
        False, description="with local_steps: stop early once all client data was seen once"
    )
    batch_size: int = Field(32, ge=1)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    lr_decay: float = Field(1.0, gt=0, le=1, description="lr multiplied by this every round")
    eval_every: int = Field(1, ge=1)
    eval_clients: int | None = Field(
        None, ge=2, description="score a fixed random sample of this many clients at each evaluation (None: all); "
        "local metrics then come with a 95%% CI over the sampled clients"
    )
    eval_global_clients: int | None = Field(
        10, ge=1, description="during the rounds, personalised models of at most this many of the evaluated clients "
        "also score the global test set (a fixed random subset; None: all): each is a full pass over the global "
        "test set, ~10× a client's training round on FMNIST. The final personalised views are scored by all"
    )
    global_test_size: int | None = Field(
        None, ge=10, description="score the global test set on a fixed, class-balanced subset of this size (None: all)"
    )
    patience: int | None = Field(None, ge=1, description="early stop after this many evals")
    time_limit: float | None = Field(
        None, gt=0, description="seconds: the last round is the first whose update ends once the run's rounds "
        "(their training and evaluations, train_s + eval_s) have taken this long; it is evaluated and the run ends as "
        "an early stop does (personalisation, summary with stopped_at_time_limit) — for a fixed budget of machine "
        "time; None: no limit")
    executor: str = Field(
        "vectorised", description="where the clients compute: a registered executor that train.executor may name "
        "(vectorised, sequential, flower; `hetfed components executor`)")
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    capture: Literal["auto", "off", "compile"] = Field(
        "auto", description="auto: on CUDA, a stacked training step is recorded once as a CUDA graph and replayed "
        "(steps of methods with their own objective, constraint or extra loss term, and models with buffers, run "
        "eagerly); on a CPU, compile for runs of 30 000 rounds or more when a C++ compiler is found (what "
        "compiling pays back after), eager otherwise; compile (CPU only): the same steps compiled with "
        "torch.compile once a batch shape has come up 20 times, 1.07-1.7x faster a round for small models but "
        "~45 s of compiling per shape the first time on a machine (~1 s from torch's cache after), for long runs; "
        "off: every step eager")
    chunk_clients: int | None = Field(
        None, ge=1, description="at most this many clients trained at once (memory budget)"
    )
    memory_budget_mb: float | None = Field(
        None, gt=0, description="working set of one chunk of clients; None: 128 MB on a CPU (cache-friendly), "
        "a quarter of the free GPU memory on CUDA (GPUs need big stacks to be busy), divided among a "
        "`hetfed sweep --jobs N`'s workers, which share the device"
    )
    checkpoint_every: Annotated[int, Field(ge=1)] | Literal["auto"] | None = Field(
        "auto", description="write a resumable checkpoint every this many rounds (and at the end of the "
        f"federated phase and of personalisation); auto: every {AUTO_CHECKPOINT_ROUNDS} rounds once "
        f"{AUTO_CHECKPOINT_SECONDS:g} s have passed since the last (or the start) — a kill loses about a minute, and "
        "a long run of quick rounds is not slowed by its checkpoints; None: only at the end. `hetfed run --resume "
        "DIR` continues"
    )
    # -- clients that fail or straggle (see docs/robustness.md; what the server does with their updates: server.*)
    client_dropout: float = Field(0.0, ge=0, lt=1, description="probability that a sampled client fails to report")
    stragglers: StragglerConfig = Field(default_factory=StragglerConfig)
    clock: ClockConfig = Field(default_factory=ClockConfig)

    @model_validator(mode="after")
    def _one_clock(self) -> TrainConfig:
        if self.stragglers.distribution == "none" and self.stragglers.deadline is not None:
            raise ValueError(f"train.stragglers.deadline = {self.stragglers.deadline:g} is not allowed with "
                             "train.stragglers.distribution = 'none': nobody would be late; expected a distribution "
                             "(lognormal, exponential, uniform) or train.clock.deadline (seconds)")
        if self.stragglers.distribution != "none" and self.clock != ClockConfig():
            raise ValueError(f"train.stragglers.distribution = {self.stragglers.distribution!r} with train.clock set "
                             "is "
                             "not allowed: stragglers is the clock in median-step units; expected train.clock alone "
                             "(latency, spread, deadline in seconds) or train.stragglers alone")
        return self

    def unread(self) -> dict[str, tuple[Any, str]]:
        """Besides its sections' (the optimiser's keys its kind has not): a key another one set here wins over
        (``local_steps`` over ``local_epochs``, ``clients_per_round`` over ``client_fraction``), one that applies only
        with another (``steps_cap_one_pass`` without ``local_steps``), one the executor does not read
        (``ExecutorKind.unread_train``)."""
        why = {"local_epochs": f"its local_steps = {self.local_steps} wins over it" if self.local_steps else "",
               "client_fraction": (f"its clients_per_round = {self.clients_per_round} wins over it"
                                   if self.clients_per_round else ""),
               "steps_cap_one_pass": "" if self.local_steps else "it applies with local_steps, which is unset",
               **registry_of("executor").get(self.executor).unread_train}
        return {**super().unread(), **{k: (v, why[k]) for k, v in self.away_from_default(*why).items() if why[k]}}

    @field_validator("checkpoint_every", mode="before")
    @classmethod
    def _checkpoint_every(cls, value: Any) -> Any:
        """One line for a value that is none of the three (pydantic's would name each branch of the union)."""
        if value is None or value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            return value
        raise ValueError(f"not allowed: expected a number of rounds ≥ 1, auto (every {AUTO_CHECKPOINT_ROUNDS} rounds "
                         f"once {AUTO_CHECKPOINT_SECONDS:g} s have passed) or null (only at the end)")

    @field_validator("executor")
    @classmethod
    def _selectable_executor(cls, name: str) -> str:
        executors = registry_of("executor")
        if executors.find(name) is None or not executors.get(name).selectable:
            selectable = [n for n, kind in executors.items() if kind.selectable]
            raise ValueError(f"not allowed: {did_you_mean(name, selectable)}expected one of {selectable}"
                              + (" (a deployment is chosen by running on one: hetfed flower run)"
                                 if name in executors.names() else ""))
        return name
