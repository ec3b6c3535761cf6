"""The round loop: sample → broadcast → train → aggregate → evaluate; then personalise.

``simulate`` tells its :class:`RoundObserver` s what each round did: the run driver's observers stream metrics
to disk as they come, so an interrupted run keeps every evaluation it finished.
It only talks to clients through an executor, so the same loop drives clients
in this process or on Flower SuperNodes.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from hetfed.config import AttackConfig, TrainConfig
from hetfed.engine.evaluate import Evaluation, global_test, summarise
from hetfed.engine.faults import Adversary, Faults, RoundFaults
from hetfed.engine.privacy import epsilon
from hetfed.engine.rng import SERVER_INIT, torch_gen
from hetfed.engine.sampling import eval_sample, expected_per_round, sample_clients
from hetfed.engine.types import Broadcast, ServerState, Upload
from hetfed.errors import RunError
from hetfed.executors.inprocess import Executor, InProcessExecutor, RoundSkipped
from hetfed.interface import Algorithm, private

if TYPE_CHECKING:
    from hetfed.partition import Federation


def resolve_device(kind: str) -> torch.device:
    if kind == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        from hetfed.errors import ConfigError

        raise ConfigError("train.device = 'cuda' is not allowed here: no CUDA device; expected 'cpu' or 'auto'")
    return torch.device(kind)


@dataclass
class SimulationResult:
    server: ServerState
    history: list[tuple[int, Evaluation]] = field(default_factory=list)
    best_round: int | None = None
    best: Evaluation | None = None
    best_server: ServerState | None = None
    rounds_done: int = 0
    stopped_early: bool = False
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
    #: (round, mean training loss over the round's clients, weighted by their sample counts)
    train_losses: list[tuple[int, float]] = field(default_factory=list)
    #: totals over the rounds: clients sampled, dropped, late, rejected (by reason), aggregated
    faults: dict[str, int] = field(default_factory=dict)
    dp_rounds: int = 0  # rounds aggregated with DP noise (what ε is computed over)
    epsilon: float | None = None  # ε after the last round (privacy.*), for privacy.delta
    #: under attack, the round training diverged at (the attack won; the best model so far is kept)
    diverged_at: int | None = None
    best_val: float = float("inf")  # the best validation loss so far (what the best model was chosen by)
    since_best: int = 0  # evaluations since it improved (early stopping)
    #: the simulated clock (hetfed.engine.clock) after the rounds so far, and the bytes that travelled so far
    sim_time: float = 0.0
    uplink_bytes: int = 0
    downlink_bytes: int = 0
    round_time: float = 0.0  # the last round's
    round_bytes: tuple[int, int] = (0, 0)  # the last round's (downlink, uplink)
    #: an asynchronous run's event queue (hetfed.executors.asynchronous.EventQueue), checkpointed with the result
    async_state: Any = None

    @property
    def states(self) -> Any:
        """Every client's local state, when the clients live in this process."""
        return getattr(self.executor, "states", {})


class DivergedError(RunError):
    """Training produced non-finite parameters or losses: nothing after it is meaningful."""


def _diverged(rnd: int, train: TrainConfig, what: str) -> str:
    return (f"training diverged at round {rnd}: {what}; earlier evaluations are kept in "
            f"metrics.csv. Expected a smaller train.optimizer.lr (now {train.optimizer.lr:g}) or "
            "server.lr, or standardised features")


def _check_finite(server: ServerState, rnd: int, train: TrainConfig) -> None:
    bad = [k for k, v in server.params.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise DivergedError(_diverged(rnd, train, f"the global parameters {bad[:3]} hold NaN or infinite values"))


def evaluation(algo: Algorithm, executor: Executor, server: ServerState, fed: Federation, clients: list[int] | None = None,
               view: str | None = None, x_global: torch.Tensor | None = None,
               y_global: torch.Tensor | None = None) -> Evaluation:
    """Clients score their models (``view``: a personalised predictor); the server scores its own."""
    ids = list(range(fed.n_clients)) if clients is None else list(clients)
    bc = algo.broadcast(server, server.round)
    reports = executor.evaluate(bc, ids, view)
    ids = reports.pop("client_ids", ids)  # the clients that answered (all, in this process)
    if not ids:
        raise RunError(f"round {server.round}: no client answered the evaluation (see failed_clients); "
                       "expected at least one reply within flower.round_timeout")
    own: dict[str, float] = {}
    if x_global is not None and y_global is not None and view in (None, algo.capabilities.federated_view):
        own = algo.evaluate_server(server, x_global, y_global)
    return summarise(reports, ids, fed.opted_out, fed.n_classes, own, y_global)


def round_train_loss(upload: Upload | None) -> float | None:
    """The round's training loss: the clients' reported losses weighted by their sample counts."""
    if upload is None or "train_loss" not in upload.extra or not len(upload.client_ids):
        return None
    loss = upload.extra["train_loss"].detach().double().cpu().reshape(-1)
    w = upload.num_samples.detach().double().cpu().reshape(-1)
    return float((loss * w).sum() / w.sum()) if float(w.sum()) > 0 else float(loss.mean())


def _sample_rate(train: TrainConfig, fed: Federation) -> float:
    """q: the share of the eligible clients a round samples (the accountant's sampling rate)."""
    eligible = int((~np.asarray(fed.opted_out, dtype=bool)).sum())
    return min(1.0, expected_per_round(train, fed.opted_out) / max(eligible, 1))


class RoundObserver:
    """What watches the round loop (the run's metrics file, progress bar, checkpoints): every hook a no-op here,
    so an observer overrides the ones it needs. The loop calls them in order of the ``observers`` it was given."""

    def trained(self, rnd: int, metrics: dict[str, float]) -> None:
        """A round's mean training loss (when any update was aggregated) and its client counts: sampled,
        dropped, late, rejected, aggregated."""

    def evaluated(self, rnd: int, ev: Evaluation) -> None:
        """An evaluation of the global model (every ``train.eval_every`` rounds and the last)."""

    def round_done(self, rnd: int, metrics: dict[str, float] | None, timing: dict[str, float]) -> None:
        """The round's metrics (when it was evaluated) and the seconds spent so far: ``train_s``, ``eval_s``."""

    def checkpoint(self, result: SimulationResult, phase: str = "federated") -> None:
        """Every ``train.checkpoint_every`` rounds and after the last: everything a resumed run needs is in
        ``result`` and the executor's client store."""


@dataclass
class _Loop:
    """One run of the round loop: what every round reads."""

    algo: Algorithm
    fed: Federation
    train: TrainConfig
    seed: int
    device: torch.device
    executor: Executor
    observers: Sequence[RoundObserver]
    faults: Faults
    eval_ids: list[int] | None
    xg: torch.Tensor | None
    yg: torch.Tensor | None
    under_attack: bool
    min_clients: int


def simulate(
    algo: Algorithm,
    fed: Federation,
    train: TrainConfig,
    seed: int,
    executor: Executor | None = None,
    observers: Sequence[RoundObserver] = (),
    attack: AttackConfig | None = None,
    resume: SimulationResult | None = None,
    resume_states: dict[str, Any] | None = None,
) -> SimulationResult:
    """Run ``train.rounds`` rounds of ``algo`` on the federation ``fed``; ``observers`` see every round.

    ``executor``: where the clients compute (None: the in-process kind ``train.executor`` names). ``attack``
    (an ``AttackConfig``) makes some clients malicious. ``resume`` (a result loaded from a checkpoint) and
    ``resume_states`` (its client store) continue from there. Every random stream is keyed by (seed, round,
    client), so the round number is its position: a resumed run draws exactly what the uninterrupted one would.
    """
    loop = _start(algo, fed, train, seed, executor, observers, attack)
    result = _initial_result(loop, resume, resume_states)
    finished = result.stopped_early or result.diverged_at is not None
    if algo.capabilities.asynchronous:  # merges as clients arrive on the simulated clock, not rounds
        from hetfed.executors.asynchronous import run_async

        run_async(loop, result, finished)
        return result
    for r in range(result.rounds_done, 0 if finished else train.rounds):
        if _one_round(loop, result, r):
            break
    return result


def _start(algo: Algorithm, fed: Federation, train: TrainConfig, seed: int, executor: Executor | None,
           observers: Sequence[RoundObserver], attack: AttackConfig | None) -> _Loop:
    """The executor started, the global test set, the evaluated clients and the faults of a run."""
    device = resolve_device(train.device)
    if executor is None:
        from hetfed.executors.kinds import executor_for

        executor = executor_for(train).client_steps(train)
    executor.start(algo, fed, seed, device)
    under_attack = attack is not None and attack.kind != "none"  # divergence is then an outcome, not an error
    if attack is not None and under_attack:
        if not hasattr(executor, "set_adversary"):
            from hetfed.errors import ConfigError

            raise ConfigError(f"attack.kind = {attack.kind!r} is simulated by the in-process executors only; "
                              "expected train.executor 'vectorised' or 'sequential' (on Flower the clients are real)")
        executor.set_adversary(Adversary(attack, fed, seed, fed.n_classes))
    algo.bind(fed, seed, expected_per_round(train, fed.opted_out))
    chain = algo.context.pipeline  # the server's policy: a round with fewer accepted updates is skipped
    xg, yg = global_test(fed, train, seed, device)
    return _Loop(algo, fed, train, seed, device, executor, observers, Faults(train, fed, seed, algo.schedule),
                 eval_sample(train, fed.n_clients, seed), xg, yg, under_attack,
                 chain.min_clients if chain is not None else 1)


def _initial_result(loop: _Loop, resume: SimulationResult | None,
                    resume_states: dict[str, Any] | None) -> SimulationResult:
    """A fresh result from the server's initial state, or a checkpoint's as it was (on this device)."""
    device = loop.device
    if resume is None:
        server = loop.algo.server_init(torch_gen(loop.seed, SERVER_INIT))
        result = SimulationResult(_to_device(server, device), executor=loop.executor)
    else:  # a checkpoint: the server, every client's state and the loop's counters as they were
        result = resume
        result.executor = loop.executor
        result.server = _to_device(result.server, device)
        if result.best_server is not None:
            result.best_server = _to_device(result.best_server, device)
        if resume_states is not None:  # None on Flower: the clients' states live on the nodes
            cast(InProcessExecutor, loop.executor).states.load_state_dict(resume_states)
    # best-model selection needs validation data on the clients that train the global model
    fed = loop.fed
    opted_out = np.asarray(fed.opted_out, dtype=bool)
    has_val = any(fed.has_validation(k) and not opted_out[k] for k in (loop.eval_ids or range(fed.n_clients)))
    result.selected_by = "val_loss" if has_val else None
    return result


def _one_round(loop: _Loop, result: SimulationResult, r: int) -> bool:
    """Round ``r + 1``: sample, train the present clients, aggregate (or skip), then :func:`after_update`."""
    algo = loop.algo
    t0 = time.perf_counter()
    upload, counts = _train_round(loop, result, r)
    t_server = time.perf_counter()
    if upload is not None:
        result.server = algo.aggregate(result.server, upload)
        result.dp_rounds += int(private(algo) is not None)
    else:
        result.skipped_rounds.append(r + 1)
    result.server_seconds += time.perf_counter() - t_server
    counts["round_skipped"] = int(upload is None)
    clock = {"round_time": result.round_time, "sim_time": result.sim_time, "downlink_bytes": result.round_bytes[0],
             "uplink_bytes": result.round_bytes[1]}
    return after_update(loop, result, upload, counts, clock, t0)


def after_update(loop: _Loop, result: SimulationResult, upload: Upload | None, counts: dict[str, int],
                 clock: dict[str, float], t0: float) -> bool:
    """What follows every server update, synchronous round or asynchronous merge: the counts and training loss to
    the observers, the divergence check, the evaluation when due, the checkpoint when due; True when the run stops
    (early stopping, divergence under attack, the last update)."""
    train = loop.train
    rnd = result.rounds_done + 1
    for key, value in counts.items():
        result.faults[key] = result.faults.get(key, 0) + value
    loss = round_train_loss(upload)
    if loss is not None:
        result.train_losses.append((rnd, loss))
    for o in loop.observers:
        o.trained(rnd, {**({"train_loss": loss} if loss is not None else {}), **counts, **clock})
    try:
        _check_finite(result.server, rnd, train)
    except DivergedError:
        if not loop.under_attack:
            raise
        result.diverged_at = rnd
    result.train_seconds += time.perf_counter() - t0
    result.rounds_done = rnd
    metrics = None
    if rnd % train.eval_every == 0 or rnd == train.rounds or result.diverged_at is not None:
        metrics = _evaluate_round(loop, result, rnd)  # a diverged model is scored once: the run's final model
    for o in loop.observers:
        o.round_done(rnd, metrics, {"train_s": result.train_seconds, "eval_s": result.eval_seconds})
    if train.patience is not None and result.since_best >= train.patience:
        result.stopped_early = True
    stop = result.stopped_early or result.diverged_at is not None
    if stop or rnd == train.rounds or (train.checkpoint_every and rnd % train.checkpoint_every == 0):
        for o in loop.observers:
            o.checkpoint(result)
    return stop


def _train_round(loop: _Loop, result: SimulationResult, r: int) -> tuple[Upload | None, dict[str, int]]:
    """The round's sampled clients, those present train; their upload (None: too few) and client counts."""
    algo = loop.algo
    sampled = sample_clients(loop.train, loop.fed.opted_out, loop.seed, r,
                             lambda eligible, m, rng: algo.select_clients(result.server, eligible, m, rng))
    bc = algo.broadcast(result.server, r)
    down, up = wire_bytes(algo, bc)
    present = loop.faults.round(sampled, r, down, up)
    upload = None
    if len(present.training) >= loop.min_clients:
        try:
            upload = loop.executor.train(bc, present.training)
        except RoundSkipped:  # too few replies (Flower): the global model stays as it was
            upload = None
    counts = _round_counts(sampled, present, upload)
    if upload is not None and len(upload.client_ids) < loop.min_clients:
        upload = None  # too few accepted updates: skipped and logged, never averaged over one client
    _advance_clock(loop, result, sampled, present, down, up)
    return upload, counts


def wire_bytes(algo: Algorithm, bc: Broadcast) -> tuple[int, int]:
    """(bytes one client receives, bytes one client sends) in a round: the broadcast's tensors, and its shared
    parameters as ``server.compression`` encodes them (when the server holds a model) plus the sample count and
    training loss (float32 each)."""
    down = sum(v.numel() * v.element_size() for v in (*bc.params.values(), *bc.extra.values())
               if isinstance(v, torch.Tensor))
    chain = algo.context.pipeline
    shapes = {k: tuple(v.shape) for k, v in bc.params.items()}
    up = chain.transport.nbytes(shapes) if chain is not None and algo.capabilities.server_model and shapes else 0
    return down, up + 8


def _advance_clock(loop: _Loop, result: SimulationResult, sampled: list[int], present: RoundFaults, down: int,
                   up: int) -> None:
    """The round's simulated duration (its slowest reporting client, or the deadline) and its bytes: every sampled
    client received the broadcast; every client that trained sent its update."""
    clock = loop.faults.clock
    result.round_time = clock.round_time(present.training, bool(present.late), down, up)
    result.sim_time += result.round_time
    result.round_bytes = (down * len(sampled), up * len(present.training))
    result.downlink_bytes += result.round_bytes[0]
    result.uplink_bytes += result.round_bytes[1]


def _to_device(state: ServerState, device: torch.device) -> ServerState:
    return ServerState({k: v.to(device) for k, v in state.params.items()}, state.round, state.extra)


def _evaluate_round(loop: _Loop, result: SimulationResult, rnd: int) -> dict[str, float]:
    """Score the round's model; keep it as the best when its validation loss is the lowest yet."""
    algo, train, fed = loop.algo, loop.train, loop.fed
    t_eval = time.perf_counter()
    server = result.server
    ev = evaluation(algo, loop.executor, server, fed, loop.eval_ids, x_global=loop.xg, y_global=loop.yg)
    ev.metrics.update(sim_time=result.sim_time, uplink_bytes_total=float(result.uplink_bytes),
                      downlink_bytes_total=float(result.downlink_bytes))
    privacy = private(algo)
    if privacy is not None and privacy.noise_multiplier is not None:
        result.epsilon = epsilon(privacy.noise_multiplier, _sample_rate(train, fed), result.dp_rounds, privacy.delta)
        ev.metrics["epsilon"] = result.epsilon
    result.eval_seconds += time.perf_counter() - t_eval
    result.evaluations += 1
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
        result.best_server = ServerState(copy.deepcopy(server.params), server.round, server.extra)
        result.since_best = 0
    else:
        result.since_best += 1
    return ev.metrics


def _round_counts(sampled: list[int], present: RoundFaults, upload: Upload | None) -> dict[str, int]:
    """A round's client counts, as metrics.csv records them."""
    screened = dict(upload.screened) if upload is not None else {}
    return {"clients_sampled": len(sampled), "clients_dropped": len(present.dropped), "clients_late": len(present.late),
            "clients_rejected_nonfinite": screened.get("rejected_nonfinite", 0),
            "clients_rejected_norm": screened.get("rejected_norm", 0),
            "clients_aggregated": len(upload.client_ids) if upload is not None else 0}


def personalise(algo: Algorithm, fed: Federation, seed: int, result: SimulationResult, device: torch.device,
                on_chunk: Callable[[int, int], object] | None = None) -> SimulationResult:
    """The client-side step after federated training, from the best global model; then every view scored.

    ``on_chunk(done, total)`` reports how many clients have finished.
    """
    executor = result.executor
    assert executor is not None
    chosen = result.best_server or result.server
    t0 = time.perf_counter()
    plan = algo.personal_plan(fed, seed)
    result.personal_info = executor.personalise(algo.broadcast(chosen, chosen.round), plan.clients,
                                                on_chunk)
    result.personal_seconds = time.perf_counter() - t0
    xg, yg = global_test(fed, algo.train, seed, device)
    ids = plan.scored
    for view in algo.capabilities.views:
        result.views[view] = evaluation(algo, executor, chosen, fed, ids, view, xg, yg)
    return result
