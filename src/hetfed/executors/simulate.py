"""The round loop: sample → broadcast → train → aggregate → evaluate; then personalise.

``simulate`` tells its :class:`RoundObserver` s what each round did: the run driver's observers stream metrics
to disk as they come, so an interrupted run keeps every evaluation it finished.
It only talks to clients through an executor, so the same loop drives clients
in this process or on Flower SuperNodes.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

import numpy as np
import torch

from hetfed.algorithms.build import resolve_run
from hetfed.config import AttackConfig, TrainConfig
from hetfed.engine.attacks import ATTACKS
from hetfed.engine.evaluate import global_test
from hetfed.engine.faults import Adversary, Faults, RoundFaults
from hetfed.engine.rng import SERVER_INIT, torch_gen
from hetfed.engine.sampling import eval_sample
from hetfed.engine.types import ServerState, Upload
from hetfed.executors.inprocess import Executor, InProcessExecutor
from hetfed.executors.updates import (
    Aggregate,
    DivergedError,
    RoundObserver,
    SimulationResult,
    Steps,
    Train,
    _Loop,
    after_update,
    backdoor_scores,
    drive,
    evaluation,
    plan_round,
    round_train_loss,
    uploaded_bytes,
)
from hetfed.interface import CLUSTERS, Algorithm
from hetfed.partition.shift import concept_groups
from hetfed.run_spec import RunSpec
from hetfed.server.chain import DECIDED, Chain
from hetfed.server.detection import detection

if TYPE_CHECKING:
    from hetfed.partition import Federation

#: what a round's run produces and who watches it live in hetfed.executors.updates (the asynchronous loop shares
#: them); they are importable from here as before
__all__ = ["DivergedError", "RoundObserver", "SimulationResult", "evaluation", "personalise", "resolve_device",
           "round_train_loss", "simulate"]


def resolve_device(kind: str, capture: str = "auto") -> torch.device:
    """``train.device`` as a device; refuses one this machine lacks, and a ``train.capture`` with no recorder there
    (``compile`` is the CPU's: a CUDA run records graphs with ``auto``)."""
    from hetfed.engine import capture as recording
    from hetfed.errors import ConfigError

    if kind == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device = 'cuda' is not allowed here: no CUDA device; expected 'cpu' or 'auto'")
    device = recording.device_of(kind)
    refused = recording.refusal(capture, device)
    if refused is not None:
        raise ConfigError(f"train.capture = {capture!r} is not allowed here (train.device = {kind!r}): {refused}; "
                          f"expected one of {sorted(recording.WHERE_AVAILABLE)}")
    return device


def simulate(
    run: RunSpec | Algorithm,
    fed: Federation,
    train: TrainConfig | None = None,
    seed: int | None = None,
    executor: Executor | None = None,
    observers: Sequence[RoundObserver] = (),
    attack: AttackConfig | None = None,
    resume: SimulationResult | None = None,
    resume_states: dict[str, Any] | None = None,
    history: bool = True,
) -> SimulationResult:
    """Run a method's rounds on the federation ``fed``; ``observers`` see every round.

    ``run``: the method's run as the plan resolved it (:class:`~hetfed.run_spec.RunSpec`), or an algorithm with
    the ``train`` section and ``seed`` to resolve it with (:func:`~hetfed.algorithms.build.resolve_run`).
    ``executor``: where the clients compute (None: the in-process kind ``train.executor`` names). ``attack``
    (an ``AttackConfig``) makes some clients malicious. ``resume`` (a result loaded from a checkpoint) and
    ``resume_states`` (its client store) continue from there. Every random stream is keyed by (seed, round,
    client), so the round number is its position: a resumed run draws exactly what the uninterrupted one would.
    ``history``: every evaluation in the result's ``history`` (False: the last one only — a run of the driver
    writes every evaluation to metrics.csv as it comes, and an evaluation of 20 clients holds ~8 KiB, ~860 MB over
    a 51-run stacked sweep of 2 000 rounds).
    """
    if not isinstance(run, RunSpec):
        if train is None or seed is None:
            raise TypeError("simulate(algorithm, fed, train, seed): an algorithm needs the train section and the seed "
                            "to run with (or pass the RunSpec the plan resolved)")
        run = resolve_run(run, fed, train, seed)
    loop = _start(run, fed, executor, observers, attack)
    loop.keep_history = history
    result = _initial_result(loop, resume, resume_states)
    result.backdoor = loop.backdoor
    finished = result.stopped_early or result.out_of_time or result.diverged_at is not None
    if run.algo.capabilities.asynchronous:  # merges as clients arrive on the simulated clock, not rounds
        from hetfed.executors.asynchronous import run_async

        run_async(loop, result, finished)
        return result
    rounds = range(result.rounds_done, 0 if finished else run.train.rounds)
    if isinstance(loop.executor, DrivesRounds):  # a stacked sweep: its runs' rounds answered together
        loop.executor.drive_rounds(lambda r: _one_round(loop, result, r), rounds)
        return result
    for r in rounds:
        if drive(_one_round(loop, result, r), loop.executor):
            break
    return result


@runtime_checkable
class DrivesRounds(Protocol):
    """An executor that runs a loop's rounds itself: ``steps(r)`` is round ``r`` (0-based) as steps (:func:`drive`,
    ending True when the run stops), for each ``r`` of ``rounds`` until one stops it. A stacked sweep's executor
    (:mod:`hetfed.executors.stacked_runs`) answers the requests of all its runs' rounds together."""

    def drive_rounds(self, steps: Callable[[int], Steps[bool]], rounds: range) -> None: ...


def _start(run: RunSpec, fed: Federation, executor: Executor | None, observers: Sequence[RoundObserver],
           attack: AttackConfig | None) -> _Loop:
    """The executor started, the global test set, the evaluated clients and the faults of a run."""
    train, seed = run.train, run.seed
    device = resolve_device(train.device, train.capture)
    if executor is None:
        from hetfed.executors.kinds import executor_for

        executor = executor_for(train).client_steps(train)
    executor.start(run, fed, device)
    under_attack = attack is not None and ATTACKS.get(attack.kind).acts  # divergence is then an outcome, not an error
    adversary = Adversary(attack, fed, seed, fed.n_classes) if attack is not None and under_attack else None
    if adversary is not None:
        if not hasattr(executor, "set_adversary"):
            from hetfed.errors import ConfigError

            raise ConfigError(f"attack.kind = {adversary.cfg.kind!r} is simulated by the in-process executors only; "
                              "expected train.executor 'vectorised' or 'sequential' (on Flower the clients are real)")
        executor.set_adversary(adversary)
    xg, yg = global_test(fed, train, seed, device)
    backdoor = adversary.backdoor_test(xg, yg, fed.opted_out) if adversary is not None and xg is not None and \
        yg is not None else None
    return _Loop(run, fed, device, executor, observers, Faults(train, fed, seed, run.schedule),
                 eval_sample(train, fed.n_clients, seed), xg, yg, under_attack, backdoor, adversary=adversary,
                 concepts=concept_groups(fed.n_clients, getattr(fed, "params", None) or {}))


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


def _one_round(loop: _Loop, result: SimulationResult, r: int) -> Steps[bool]:
    """Round ``r + 1``: sample, train the present clients, aggregate (or skip), then :func:`after_update`."""
    algo = loop.algo
    t0 = time.perf_counter()
    upload, counts, trained = yield from _train_round(loop, result, r)
    t_server = time.perf_counter()
    per_round: dict[str, float] = {}
    per_client: dict[str, list[float]] = {}
    if upload is not None:
        result.server = yield Aggregate(algo, result.server, upload)
        result.dp_rounds += int(loop.run.privacy is not None)
        found = _detected(loop, result.server, r, trained)
        if "attack_weight" in found:
            per_round["attack_weight"] = found.pop("attack_weight")
            result.attack_weight_sum += per_round["attack_weight"]
            result.attack_weight_rounds += 1
        counts.update(cast(dict[str, int], found))
        result.findings, per_client = _findings(loop, result.server, upload)
        result.client_findings = per_client
        per_round.update(result.findings)
    else:
        result.skipped_rounds.append(r + 1)
    result.server_seconds += time.perf_counter() - t_server
    counts["round_skipped"] = int(upload is None)
    per_round.update(round_time=result.round_time, sim_time=result.sim_time, downlink_bytes=result.round_bytes[0],
                     uplink_bytes=result.round_bytes[1])
    return (yield from after_update(loop, result, upload, counts, per_round, t0, per_client))


def _findings(loop: _Loop, server: ServerState, upload: Upload) -> tuple[dict[str, float], dict[str, list[float]]]:
    """What the method's server step found this round (:meth:`~hetfed.interface.Algorithm.findings`), as numbers,
    and what it found of each client (a tensor with one value a client of the federation: Agnostic FL's λ), as
    lists; a tensor of another length is refused, naming the method (a plugin's mistake, caught at its first round).
    A clustered method's clusters become how many clusters the round's clients are in (``clusters``) and, where the
    partition gave the clients concepts (``partition.rotations``, ``label_swaps``), how well those clusters are the
    concepts: scikit-learn's adjusted Rand index over the round's clients (``cluster_ari``: 1 the concepts exactly,
    about 0 a draw at random; what IFCA's code reports as the share assigned right, without its need to number the
    clusters as the groups)."""
    found = dict(loop.algo.findings(server, upload))
    assigned = found.pop(CLUSTERS, None)
    n = loop.fed.n_clients
    per_client = {k: v.tolist() for k, v in found.items() if isinstance(v, torch.Tensor) and v.ndim}
    for key, values in per_client.items():
        if len(values) != n:
            raise ValueError(f"{loop.algo.spec.name}: findings[{key!r}] holds {len(values)} values; a finding of each "
                             f"client holds one a client of the federation ({n})")
    out = {k: float(v) for k, v in found.items() if k not in per_client}
    if assigned is None:
        return out, per_client
    assigned = torch.as_tensor(assigned)
    out[CLUSTERS] = float(len(torch.unique(assigned)))
    if loop.concepts is not None:
        from sklearn.metrics import adjusted_rand_score

        out["cluster_ari"] = float(adjusted_rand_score(loop.concepts[upload.client_ids], assigned.numpy()))
    return out, per_client


def _detected(loop: _Loop, server: ServerState, r: int, trained: list[int]) -> dict[str, float]:
    """What the server's defence decided about round ``r``'s (0-based) malicious updates
    (:func:`hetfed.server.detection.detection`), when they attacked and the combine rule weighs updates
    (:data:`hetfed.server.chain.DECIDED`; under bucketing, each bucket's weight shared by its members); {} otherwise
    (no attack that round, a rule that weighs no update — centered clipping, the robust learning rate —, DP's noised
    mean, a method whose server combines several models)."""
    if loop.adversary is None or not loop.adversary.acts_in(r):
        return {}
    decided = cast(dict[str, Any], server.extra.get(Chain.STATE, {})).get(DECIDED)
    if decided is None or decided["round"] != r:
        return {}
    return detection(loop.adversary.malicious, trained, decided)


def _train_round(loop: _Loop, result: SimulationResult,
                 r: int) -> Steps[tuple[Upload | None, dict[str, int], list[int]]]:
    """The round's sampled clients, those present train; their upload (None: too few), client counts and the
    clients that trained."""
    plan = loop.planned.pop(r, None) or plan_round(loop, result, r)  # decided early when it rode an evaluation
    sampled, bc, down, up, present = plan.sampled, plan.bc, plan.down, plan.up, plan.present
    upload = None
    for o in loop.observers:
        o.sending(r + 1, bc, present.training, loop.executor)
    exchange = result.rode_seconds  # a round sent with the evaluation before it: that exchange's seconds
    result.rode_seconds = 0.0
    if len(present.training) >= loop.min_clients:
        sent = time.perf_counter()
        upload = yield Train(bc, present.training)
        exchange += time.perf_counter() - sent
    if len(present.training) >= loop.min_clients and loop.run.schedule.records is not None:
        steps = result.record_steps  # each client's DP-SGD steps (its ε): all that trained, whatever the server
        for k in present.training:  # then accepted
            steps[k] = steps.get(k, 0) + loop.algo.private_steps(len(loop.fed.train[k]))
    counts = _round_counts(sampled, present, upload)
    if upload is not None and upload.client_ids:
        up = uploaded_bytes(upload, up)  # what the clients' uploads carried besides their parameters
    if upload is not None and len(upload.client_ids) < loop.min_clients:
        upload = None  # too few accepted updates: skipped and logged, never averaged over one client
    _advance_clock(loop, result, sampled, present, down, up, exchange)
    return upload, counts, present.training


def _advance_clock(loop: _Loop, result: SimulationResult, sampled: list[int], present: RoundFaults, down: int,
                   up: int, exchange: float) -> None:
    """The round's simulated duration (its slowest reporting client, or the deadline; on the wall clock its
    training ``exchange``'s real seconds) and its bytes: every sampled client received the broadcast; every client
    that trained sent its update."""
    clock = loop.faults.clock
    result.round_time = clock.round_time(present.training, bool(present.late), down, up, exchange)
    result.sim_time += result.round_time
    result.round_bytes = (down * len(sampled), up * len(present.training))
    result.downlink_bytes += result.round_bytes[0]
    result.uplink_bytes += result.round_bytes[1]


def _to_device(state: ServerState, device: torch.device) -> ServerState:
    return ServerState({k: v.to(device) for k, v in state.params.items()}, state.round, state.extra)


def _round_counts(sampled: list[int], present: RoundFaults, upload: Upload | None) -> dict[str, int]:
    """A round's client counts, as metrics.csv records them."""
    screened = dict(upload.screened) if upload is not None else {}
    return {"clients_sampled": len(sampled), "clients_dropped": len(present.dropped), "clients_late": len(present.late),
            "clients_rejected_nonfinite": screened.get("rejected_nonfinite", 0),
            "clients_rejected_norm": screened.get("rejected_norm", 0),
            "clients_aggregated": len(upload.client_ids) if upload is not None else 0}


def personalise(run: RunSpec, fed: Federation, result: SimulationResult, device: torch.device,
                on_chunk: Callable[[int, int], object] | None = None) -> SimulationResult:
    """The client-side step after federated training, from the best global model; then every view scored.

    ``on_chunk(done, total)`` reports how many clients have finished.
    """
    executor, algo, seed = result.executor, run.algo, run.seed
    assert executor is not None
    chosen = result.best_server or result.server
    t0 = time.perf_counter()
    plan = algo.personal_plan(fed, seed)
    ids = plan.scored
    ride = getattr(executor, "ride_views", None)  # Flower's: the views scored in the personalisation's exchange
    if ride is not None and algo.capabilities.views:
        ride(list(algo.capabilities.views), list(range(fed.n_clients)) if ids is None else ids)
    result.personal_info = executor.personalise(algo.broadcast(chosen, chosen.round), plan.clients,
                                                on_chunk)
    result.personal_seconds = time.perf_counter() - t0
    xg, yg = global_test(fed, run.train, seed, device)
    for view in algo.capabilities.views:
        result.views[view] = ev = evaluation(algo, executor, chosen, fed, ids, view, xg, yg)
        if result.backdoor is not None:
            ev.metrics.update(drive(backdoor_scores(algo, executor, chosen, result.backdoor, ids, view), executor))
    return result
