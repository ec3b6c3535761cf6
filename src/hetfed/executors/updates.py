"""What every server update is followed by, synchronous round or asynchronous merge: the run's result so far
(:class:`SimulationResult`), the observers that watch it (:class:`RoundObserver`), the evaluation when due, the
divergence check, the checkpoint when due (:func:`after_update`), and the bytes a client sends and receives.

:mod:`hetfed.executors.simulate` (rounds) and :mod:`hetfed.executors.asynchronous` (arrivals on the simulated
clock) both drive a run through these.

The loop's work is written as steps (generators) that yield what they ask of the clients and the server — a
:class:`Train`, :class:`Aggregate`, :class:`ReadBack`, :class:`Evaluate`, :class:`ScoreServer` or :class:`Summarise`
request — and are sent the answer: :func:`drive` answers each as it comes from one executor, and a
stacked sweep answers the requests of all its runs together (:mod:`hetfed.executors.stacked_runs`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np
import torch

from hetfed.config import TrainConfig
from hetfed.config_train import checkpoint_due
from hetfed.engine.backdoor import BackdoorTest, client_backdoor_accuracy
from hetfed.engine.evaluate import Evaluation
from hetfed.engine.faults import Adversary, Faults, RoundFaults
from hetfed.engine.privacy import epsilon
from hetfed.engine.record_dp import record_epsilon
from hetfed.engine.sampling import sample_clients
from hetfed.engine.summary import Reports
from hetfed.engine.types import Broadcast, ServerState, Upload
from hetfed.errors import RunError
from hetfed.executors.inprocess import Executor, InProcessExecutor, RoundSkipped
from hetfed.interface import Algorithm, own_parameters
from hetfed.run_spec import RunSpec

if TYPE_CHECKING:
    from hetfed.partition import Federation

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class Train:
    """What a round asks of its executor: ``clients`` train on ``bc``. A loop's steps (:func:`drive`) yield it and
    get the round's upload back (None: too few replies, Flower's :class:`RoundSkipped`)."""

    bc: Broadcast
    clients: list[int]

    def answer(self, executor: Executor) -> Upload | None:
        try:
            return executor.train(self.bc, self.clients)
        except RoundSkipped:  # too few replies (Flower): the global model stays as it was
            return None


@dataclass(frozen=True, eq=False)
class Evaluate:
    """What an evaluation asks of its executor: ``clients`` score ``bc``'s model (``view``: a personalised
    predictor); the steps get the clients' reports back."""

    bc: Broadcast
    clients: list[int]
    view: str | None = None
    #: ``(x, y)`` every client scores in place of the global test set (a backdoor's stamped samples; an in-process
    #: executor's evaluation only: attacks are simulated there)
    global_set: tuple[torch.Tensor, torch.Tensor] | None = None

    def answer(self, executor: Executor) -> dict[str, list[Any]]:
        if self.global_set is None:
            return executor.evaluate(self.bc, self.clients, self.view)
        return cast(InProcessExecutor, executor).evaluate(self.bc, self.clients, self.view,
                                                          global_set=self.global_set)


@dataclass(frozen=True, eq=False)
class ScoreServer:
    """What an evaluation asks of the server: its model (``server``'s state of ``algo``'s method) scored on the
    global test set ``x``, ``y``; the steps get the metrics back. Asked like the clients' work so that a stacked
    sweep scores its runs' servers in one forward (:func:`hetfed.interface.evaluate_servers`)."""

    algo: Algorithm
    server: ServerState
    x: torch.Tensor
    y: torch.Tensor

    def answer(self, executor: Executor) -> dict[str, float]:
        return self.algo.evaluate_server(self.server, self.x, self.y)


@dataclass(frozen=True, eq=False)
class Summarise:
    """What an evaluation asks last: the clients' reports and the server's scores made the run's metrics
    (:meth:`~hetfed.engine.summary.Reports.summary`). Asked so that a stacked sweep summarises its runs' evaluations
    at once (:func:`hetfed.engine.summary.summaries`)."""

    reports: Reports

    def answer(self, executor: Executor) -> Evaluation:
        return self.reports.summary()


@dataclass(frozen=True, eq=False)
class Aggregate:
    """What a round asks of its server after its clients trained: ``algo``'s method's update of ``server`` with the
    round's ``upload``; the steps get the new state back. Asked so that a stacked sweep aggregates runs whose
    method computes along a run axis in one call (:class:`~hetfed.interface.AggregatesRuns`)."""

    algo: Algorithm
    server: ServerState
    upload: Upload

    def answer(self, executor: Executor) -> ServerState:
        return self.algo.aggregate(self.server, self.upload)


@dataclass(frozen=True, eq=False)
class ReadBack:
    """What a round reads back after its server update: the clients' reported training loss and the server's
    parameters that are not finite (empty: none). Asked so that a stacked sweep reads every run's at once, one
    transfer from the device for all of them (:func:`read_back`), not two a run."""

    upload: Upload | None
    server: ServerState

    def answer(self, executor: Executor) -> tuple[float | None, list[str]]:
        return read_back([self])[0]


#: what a loop asks while it runs
Request = Train | Aggregate | Evaluate | ScoreServer | Summarise | ReadBack
#: a loop's work between what it asks of the clients and the server: it yields each request and is sent its answer
Steps = Generator[Request, Any, T]


def drive(steps: Steps[T], executor: Executor) -> T:
    """``steps`` run to the end, each request answered by ``executor`` as it comes. The loop is written as steps so
    that whoever holds many runs' loops may answer their requests together instead (a stacked sweep:
    :mod:`hetfed.executors.stacked_runs`)."""
    try:
        request = next(steps)
        while True:
            request = steps.send(request.answer(executor))
    except StopIteration as end:
        return cast(T, end.value)


@dataclass
class SimulationResult:
    server: ServerState
    #: (round, evaluation) of every evaluation so far, or of the last only (``simulate(history=False)``)
    history: list[tuple[int, Evaluation]] = field(default_factory=list)
    best_round: int | None = None
    best: Evaluation | None = None
    best_server: ServerState | None = None
    rounds_done: int = 0
    stopped_early: bool = False
    #: the rounds took ``train.time_limit`` seconds: the last round run was the last (:func:`after_update`)
    out_of_time: bool = False
    selected_by: str | None = "val_loss"  # None: no validation data, so best = final
    train_seconds: float = 0.0
    server_seconds: float = 0.0  # the aggregate step's share of train_seconds
    eval_seconds: float = 0.0  # every evaluation during the rounds (not part of train_seconds)
    evaluations: int = 0
    #: after personalisation: each view's evaluation, the per-client info and seconds
    views: dict[str, Evaluation] = field(default_factory=dict)
    personal_info: dict[str, list[float]] = field(default_factory=dict)
    personal_seconds: float = 0.0
    executor: Executor | None = None
    skipped_rounds: list[int] = field(default_factory=list)  # too few replies: not aggregated
    #: totals over the rounds: clients sampled, dropped, late, rejected (by reason), aggregated
    faults: dict[str, int] = field(default_factory=dict)
    dp_rounds: int = 0  # rounds aggregated with DP noise (what ε is computed over)
    epsilon: float | None = None  # ε after the last round (privacy.*), for privacy.delta
    delta: float | None = None  # the δ of ε and of record_epsilon (privacy.delta)
    #: record-level DP (privacy.record): each client's DP-SGD steps so far, and the largest ε over clients
    record_steps: dict[int, int] = field(default_factory=dict)
    record_epsilon: float | None = None
    #: under attack, the round training diverged at (the attack won; the best model so far is kept)
    diverged_at: int | None = None
    #: under attack, the malicious updates' share of the combine rule's weights, summed over the rounds it weighed
    #: them in, and how many rounds that was (:mod:`hetfed.server.detection`)
    attack_weight_sum: float = 0.0
    attack_weight_rounds: int = 0
    #: what the method's server step found in the last round: a clustered method's clusters and how they match the
    #: clients' concepts, Agnostic FL's λ, CFL's update norms (:func:`hetfed.executors.simulate._findings`)
    findings: dict[str, float] = field(default_factory=dict)
    #: what it found of each client in the last round, ``{name: [client 0's, client 1's, …]}``: Agnostic FL's λ
    client_findings: dict[str, list[float]] = field(default_factory=dict)
    best_val: float = float("inf")  # the best validation loss so far (what the best model was chosen by)
    since_best: int = 0  # evaluations since it improved (early stopping)
    #: the simulated clock (hetfed.engine.clock) after the rounds so far, and the bytes that travelled so far
    sim_time: float = 0.0
    #: the seconds of the exchange that carried the next round's training with an evaluation (Flower's ride), which
    #: that round's wall-clock time includes
    rode_seconds: float = 0.0
    uplink_bytes: int = 0
    downlink_bytes: int = 0
    round_time: float = 0.0  # the last round's
    round_bytes: tuple[int, int] = (0, 0)  # the last round's (downlink, uplink)
    #: an asynchronous run's event queue (hetfed.executors.asynchronous.EventQueue), checkpointed with the result
    async_state: Any = None
    #: a backdoor attack's test set, which the personalised views are scored on too (not checkpointed: a resumed
    #: run makes it again)
    backdoor: BackdoorTest | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A checkpoint written before a field existed resumes with that field's default (and one written while
        a field existed that is gone, without it: ``train_losses``, every round's loss, which nothing read and
        every checkpoint pickled again — 2 ms a checkpoint at 2 000 rounds; the losses are in metrics.csv;
        ``clustering``, now part of ``findings``)."""
        state.pop("train_losses", None)
        state.setdefault("findings", state.pop("clustering", {}))
        for f in dataclasses.fields(self):
            if f.name not in state:
                state[f.name] = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        self.__dict__.update(state)

    @property
    def states(self) -> Any:
        """Every client's local state, when the clients live in this process."""
        return getattr(self.executor, "states", {})


class DivergedError(RunError):
    """Training produced non-finite parameters or losses: nothing after it is meaningful."""


def _diverged(rnd: int, train: TrainConfig, what: str) -> str:
    return (f"training diverged at round {rnd}: {what}; earlier evaluations are kept in "
            f"metrics.csv. Expected a smaller train.optimizer.lr (now {train.optimizer.lr:g}) or "
            "server.optimizer.lr, or standardised features")



def evaluation(algo: Algorithm, executor: Executor, server: ServerState, fed: Federation,
               clients: list[int] | None = None,
               view: str | None = None, x_global: torch.Tensor | None = None,
               y_global: torch.Tensor | None = None) -> Evaluation:
    """Clients score their models (``view``: a personalised predictor); the server scores its own."""
    return drive(evaluation_steps(algo, server, fed, clients, view, x_global, y_global), executor)


def evaluation_steps(algo: Algorithm, server: ServerState, fed: Federation, clients: list[int] | None = None,
                     view: str | None = None, x_global: torch.Tensor | None = None,
                     y_global: torch.Tensor | None = None) -> Steps[Evaluation]:
    """:func:`evaluation` as steps: the clients' scores asked for (:class:`Evaluate`), the server's model's
    (:class:`ScoreServer`), then summarised (:class:`Summarise`)."""
    ids = list(range(fed.n_clients)) if clients is None else list(clients)
    bc = algo.broadcast(server, server.round)
    reports = yield Evaluate(bc, ids, view)
    ids = reports.pop("client_ids", ids)  # the clients that answered (all, in this process)
    if not ids:
        raise RunError(f"round {server.round}: no client answered the evaluation (see failed_clients); "
                       "expected at least one reply within flower.round_timeout")
    own: dict[str, float] = {}
    if x_global is not None and y_global is not None and view in (None, algo.capabilities.federated_view):
        own = yield ScoreServer(algo, server, x_global, y_global)
    summary: Evaluation = yield Summarise(Reports(reports, ids, fed.opted_out, fed.n_classes, own, y_global))
    return summary


def round_train_loss(upload: Upload | None) -> float | None:
    """The round's training loss: the clients' reported losses weighted by their sample counts."""
    return read_back([ReadBack(upload, ServerState({}, 0))])[0][0]


def read_back(asked: Sequence[ReadBack]) -> list[tuple[float | None, list[str]]]:
    """Each request's round training loss (the clients' reported losses weighted by their sample counts; None when
    none reported) and the names of its server's floating parameters that hold a NaN or ±inf, from one read of the
    device for all of them (their tensors on one device).

    A parameter's norm is finite when its values are (a NaN or ±inf makes it NaN or inf), so only the parameters of
    a server with a norm that is not finite (a non-finite value, or finite values whose norm overflows) are checked
    value by value. Every request's numbers are computed from its own values alone, the same whichever requests it
    is read with."""
    parts: list[torch.Tensor] = []
    shapes: list[tuple[int, list[str]]] = []  # per request: its clients (-1: no loss reported), its parameters read
    for a in asked:
        upload, n = a.upload, -1
        if upload is not None and "train_loss" in upload.extra and len(upload.client_ids):
            loss = upload.extra["train_loss"].detach().reshape(-1)
            n = len(loss)
            parts += [loss.double(), upload.num_samples.detach().to(loss.device).double().reshape(-1)]
        floating = [k for k, v in a.server.params.items() if v.is_floating_point()]
        if floating:
            parts.append(torch.stack(torch._foreach_norm([a.server.params[k].detach() for k in floating])).double())
        shapes.append((n, floating))
    values = torch.cat([p.to(parts[0].device) for p in parts]).cpu().numpy() if parts else np.zeros(0)
    out, at = [], 0
    for a, (n, floating) in zip(asked, shapes, strict=True):
        loss_value = None
        if n >= 0:
            losses, weights = values[at:at + n], values[at + n:at + 2 * n]
            total = weights.sum()
            loss_value = float((losses * weights).sum() / total) if total > 0 else float(losses.mean())
            at += 2 * n
        bad: list[str] = []
        if floating:
            if not np.isfinite(values[at:at + len(floating)]).all():
                bad = [k for k in floating if not bool(torch.isfinite(a.server.params[k]).all())]
            at += len(floating)
        out.append((loss_value, bad))
    return out


def _sample_rate(run: RunSpec, fed: Federation) -> float:
    """q: the share of the eligible clients a round samples (the accountant's sampling rate)."""
    eligible = int((~np.asarray(fed.opted_out, dtype=bool)).sum())
    return min(1.0, run.per_round / max(eligible, 1))


class RoundObserver:
    """What watches the round loop (the run's metrics file, progress bar, checkpoints): every hook a no-op here,
    so an observer overrides the ones it needs. The loop calls them in order of the ``observers`` it was given."""

    def trained(self, rnd: int, metrics: dict[str, float]) -> None:
        """A round's mean training loss (when any update was aggregated), its client counts (sampled, dropped, late,
        rejected, aggregated) and what the server found."""

    def found_of_clients(self, rnd: int, per_client: dict[str, list[float]]) -> None:
        """What the server found of each client in round ``rnd`` (``{name: [client 0's, …]}``: Agnostic FL's λ;
        :meth:`~hetfed.interface.Algorithm.findings`), after :meth:`trained`; only in rounds it found any."""

    def evaluated(self, rnd: int, ev: Evaluation) -> None:
        """An evaluation of the global model (every ``train.eval_every`` rounds and the last)."""

    def round_done(self, rnd: int, metrics: dict[str, float] | None, timing: dict[str, float]) -> None:
        """The round's metrics (when it was evaluated) and the seconds spent so far: ``train_s``, ``eval_s``."""

    def sending(self, rnd: int, bc: Broadcast, clients: list[int], executor: Executor) -> None:
        """Round ``rnd``'s broadcast, about to be trained on by ``clients`` (those present) on ``executor``: what
        an attack on one client's upload (:mod:`hetfed.runs.leakage`) asks the executor about."""

    def checkpoint(self, result: SimulationResult, phase: str = "federated") -> None:
        """When ``train.checkpoint_every`` makes it due (:func:`hetfed.config_train.checkpoint_due`) and after the
        last round: everything a resumed run needs is in ``result`` and the executor's client store."""


@dataclass
class _Loop:
    """One run of the round loop: what every round reads."""

    run: RunSpec
    fed: Federation
    device: torch.device
    executor: Executor
    observers: Sequence[RoundObserver]
    faults: Faults
    eval_ids: list[int] | None
    xg: torch.Tensor | None
    yg: torch.Tensor | None
    under_attack: bool
    #: a backdoor attack's test set (the global test set's other classes, stamped; labelled its target), or None
    backdoor: BackdoorTest | None = None
    #: the run's malicious clients and their attack, or None (no attack)
    adversary: Adversary | None = None
    #: every evaluation kept in ``result.history`` (False: the last only — a run whose observers write them all)
    keep_history: bool = True
    #: rounds decided early, to ride on the evaluation before them (:func:`ride_next_round`), by 0-based index
    planned: dict[int, RoundPlan] = field(default_factory=dict)
    #: each client's concept (:func:`hetfed.partition.shift.concept_groups`), or None: the partition made none
    concepts: np.ndarray | None = None
    #: when the last checkpoint was written (``time.perf_counter``; the loop's start before the first)
    last_checkpoint: float = field(default_factory=time.perf_counter)

    @property
    def algo(self) -> Algorithm:
        return self.run.algo

    @property
    def train(self) -> TrainConfig:
        return self.run.train

    @property
    def seed(self) -> int:
        return self.run.seed

    @property
    def min_clients(self) -> int:
        """A round with fewer accepted updates is skipped (the server's policy, ``server.min_clients``)."""
        return self.run.min_clients


@dataclass(frozen=True)
class RoundPlan:
    """A synchronous round decided before it runs: whom it sampled, what they are sent (and its bytes each way per
    client), and who of them is present to train (dropouts and deadline)."""

    r: int
    sampled: list[int]
    bc: Broadcast
    down: int
    up: int
    present: RoundFaults


def plan_round(loop: _Loop, result: SimulationResult, r: int) -> RoundPlan:
    """Round ``r`` (0-based) decided from the server's state: the same whenever it is asked between the update
    before it and its training (sampling, broadcast and faults are functions of the seed, the round and that
    state)."""
    algo = loop.algo
    sampled = sample_clients(loop.train, loop.fed.opted_out, loop.seed, r,
                             lambda eligible, m, rng: algo.select_clients(result.server, eligible, m, rng))
    bc = algo.broadcast(result.server, r)
    down, up = wire_bytes(loop.run, bc)
    return RoundPlan(r, sampled, bc, down, up, loop.faults.round(sampled, r, down, up))


def ride_next_round(loop: _Loop, result: SimulationResult, rnd: int) -> bool:
    """Before evaluating the model of ``rnd`` rounds, hand an executor that can (``ride``: Flower's, one exchange
    per node for both) the next round's training to send with the evaluation — when that round surely comes next:
    not past the last, no divergence, early stopping unable to fire on this evaluation, and the model scored the
    one that round broadcasts (no round was skipped). The plan is kept for the round to run as decided. True when
    the round was handed over (the evaluation's exchange is then that round's time: ``ride_seconds``)."""
    ride = getattr(loop.executor, "ride", None)
    train = loop.train
    if (ride is None or loop.algo.capabilities.asynchronous or rnd >= train.rounds or result.diverged_at is not None
            or result.server.round != rnd or result.out_of_time):
        return False
    if train.patience is not None and result.since_best + 1 >= train.patience:
        return False
    plan = loop.planned[rnd] = plan_round(loop, result, rnd)
    if len(plan.present.training) < loop.min_clients:
        return False
    ride(plan.bc, plan.present.training)
    return True



def after_update(loop: _Loop, result: SimulationResult, upload: Upload | None, counts: dict[str, int],
                 per_round: dict[str, float], t0: float, per_client: dict[str, list[float]] | None = None
                 ) -> Steps[bool]:
    """What follows every server update, synchronous round or asynchronous merge: the counts (totalled over the
    rounds too), the values of the round alone (``per_round``: the clock's, an attack's weight share) and the
    training loss to the observers (with ``per_client``, what the server found of each client), the divergence
    check, the evaluation when due, the checkpoint when due; True when the run stops (early stopping, divergence
    under attack, the rounds' time limit, the last update). As steps: the evaluation asks its clients."""
    train = loop.train
    rnd = result.rounds_done + 1
    for key, value in counts.items():
        result.faults[key] = result.faults.get(key, 0) + value
    loss, bad = yield ReadBack(upload, result.server)
    for o in loop.observers:
        o.trained(rnd, {**({"train_loss": loss} if loss is not None else {}), **counts, **per_round})
        if per_client:
            o.found_of_clients(rnd, per_client)
    if bad:
        if not loop.under_attack:
            raise DivergedError(_diverged(rnd, train, f"the global parameters {bad[:3]} hold NaN or infinite values"))
        result.diverged_at = rnd
    result.train_seconds += time.perf_counter() - t0
    result.rounds_done = rnd
    if train.time_limit is not None and result.train_seconds + result.eval_seconds >= train.time_limit:
        result.out_of_time = True  # decided before this round's evaluation, which then hands no next round over
    metrics = None
    if rnd % train.eval_every == 0 or rnd == train.rounds or result.diverged_at is not None or result.out_of_time:
        metrics = yield from _evaluate_round(loop, result, rnd)  # a diverged model is scored once: its final model
    for o in loop.observers:
        o.round_done(rnd, metrics, {"train_s": result.train_seconds, "eval_s": result.eval_seconds})
    if train.patience is not None and result.since_best >= train.patience:
        result.stopped_early = True
    stop = result.stopped_early or result.out_of_time or result.diverged_at is not None
    if stop or rnd == train.rounds or checkpoint_due(train.checkpoint_every, rnd,
                                                     time.perf_counter() - loop.last_checkpoint):
        loop.last_checkpoint = time.perf_counter()
        for o in loop.observers:
            o.checkpoint(result)
    return stop



def wire_bytes(run: RunSpec, bc: Broadcast) -> tuple[int, int]:
    """(bytes one client receives, bytes one client sends) in a round: the broadcast's tensors (of its
    ``personal`` table, one row), and its shared
    parameters as ``server.compression`` encodes them (when the server holds a model) plus the sample count and
    training loss (float32 each)."""
    down = sum(v.numel() * v.element_size() for v in (*bc.params.values(), *bc.extra.values())
               if isinstance(v, torch.Tensor))
    down += sum(v[0].numel() * v.element_size() for v in bc.personal.values() if len(v))  # its own row
    chain = run.chain
    shapes = {k: tuple(v.shape) for k, v in bc.params.items()}
    up = chain.transport.nbytes(shapes) if chain is not None and run.algo.capabilities.server_model and shapes else 0
    return down, up + 8



def uploaded_bytes(upload: Upload, up: int) -> int:
    """The bytes one client of ``upload`` sent: ``up`` (:func:`wire_bytes`: its parameters as encoded, its sample
    count and training loss) plus every other documented extra it carried (one row each: FedProto's prototypes,
    FedCAC's mask, FedPAC's head and statistics)."""
    return up + sum(v[0].numel() * v.element_size() for k, v in upload.extra.items()
                    if k != "train_loss" and isinstance(v, torch.Tensor) and v.dim() >= 1 and len(v))


def backdoor_scores(algo: Algorithm, executor: Executor, server: ServerState, test: BackdoorTest,
                    evaluated: list[int] | None, view: str | None = None) -> Steps[dict[str, float]]:
    """A backdoor's success: the share of stamped samples the server's model labels the target
    (``backdoor_accuracy``; for the model, or the view that is it) and, where the clients predict with models of
    their own (a personalised method, or a view), the honest ones of ``evaluated`` (None: every client) evaluating
    their models as at every evaluation with the stamped set as the global test set: their mean share
    (``local_backdoor_accuracy_mean``)."""
    out: dict[str, float] = {}
    if view in (None, algo.capabilities.federated_view):
        scored = yield ScoreServer(algo, server, test.x, test.y)
        accuracy = [v for k, v in scored.items() if k.endswith("_accuracy")]
        out.update({"backdoor_accuracy": accuracy[0]} if accuracy else {})
    among = None if evaluated is None else set(evaluated)
    clients = [k for k in test.honest if among is None or k in among]
    if clients and isinstance(executor, InProcessExecutor) and (view is not None or own_parameters(algo)):
        bc = algo.broadcast(server, server.round)
        share = client_backdoor_accuracy((yield Evaluate(bc, clients, view, (test.x, test.y))))
        out.update({} if share is None else {"local_backdoor_accuracy_mean": share})
    return out


def _evaluate_round(loop: _Loop, result: SimulationResult, rnd: int) -> Steps[dict[str, float]]:
    """Score the round's model; keep it as the best when its validation loss is the lowest yet."""
    algo, train, fed = loop.algo, loop.train, loop.fed
    t_eval = time.perf_counter()
    server = result.server
    rode = ride_next_round(loop, result, rnd)
    ev = yield from evaluation_steps(algo, server, fed, loop.eval_ids, x_global=loop.xg, y_global=loop.yg)
    if loop.backdoor is not None:
        ev.metrics.update((yield from backdoor_scores(algo, loop.executor, server, loop.backdoor, loop.eval_ids)))
    ev.metrics.update(sim_time=result.sim_time, uplink_bytes_total=float(result.uplink_bytes),
                      downlink_bytes_total=float(result.downlink_bytes))
    privacy, run = loop.run.privacy, loop.run
    if privacy is not None and privacy.noise_multiplier is not None:
        result.epsilon = epsilon(privacy.noise_multiplier, _sample_rate(run, fed), result.dp_rounds, privacy.delta)
        result.delta = privacy.delta
        ev.metrics["epsilon"] = result.epsilon
    records = run.schedule.records
    if records is not None and records.noise_multiplier is not None and run.records is not None:
        clients = sorted(result.record_steps)
        result.record_epsilon = record_epsilon(records.noise_multiplier, run.schedule.batch_size,
                                               [len(fed.train[k]) for k in clients],
                                               [result.record_steps[k] for k in clients], run.records.delta)
        result.delta = run.records.delta
        ev.metrics["record_epsilon"] = result.record_epsilon
    # an exchange that carried the next round's training is that round's time (the round is the exchange)
    carried = float(getattr(loop.executor, "ride_seconds", 0.0)) if rode else 0.0
    result.eval_seconds += time.perf_counter() - t_eval - carried
    result.train_seconds += carried
    result.rode_seconds = carried  # the next round's exchange, on the wall clock
    result.evaluations += 1
    if not loop.keep_history:
        result.history.clear()
    result.history.append((rnd, ev))
    for o in loop.observers:
        o.evaluated(rnd, ev)
    has_val = result.selected_by is not None
    val = ev.metrics["val_loss"]
    if has_val and not np.isfinite(val):
        if not loop.under_attack:
            raise DivergedError(_diverged(rnd, train, "the validation loss is not finite"))
        result.diverged_at = rnd
        return ev.metrics
    if not has_val or val < result.best_val:  # without validation data, best = the latest
        result.best_val = val if has_val else result.best_val
        result.best_round, result.best = rnd, ev
        result.best_server = ServerState({k: v.clone() for k, v in server.params.items()}, server.round, server.extra)
        result.since_best = 0
    else:
        result.since_best += 1
    return ev.metrics


