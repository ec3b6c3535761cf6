"""The asynchronous server's event loop on the simulated clock (FedBuff, FedAsync: ``Capabilities.asynchronous``).

``concurrency`` M clients train at once. A client sent model version v at time t arrives at t plus its round on
the clock (:class:`hetfed.engine.clock.Clock`: compute + network); arrivals are taken in time order (ties: in the
order they were sent), each one's staleness is the server updates made since v, and every ``buffer`` K arrivals
the algorithm merges them (:meth:`hetfed.algorithms._async.Asynchronous.merge`, through its server chain) into a
new version. Each arrival frees its slot, and a client that is idle and has not yet trained on the current version
is drawn (uniformly, from the run seed and the send counter) to fill it.

Vectorised: training is lazy. A client's update depends only on the version it was sent and its own streams
(keyed by run seed, version and client id, like a synchronous round's), not on when it runs, so the clients sent
the same version are trained as one stack (through the executor, like a round) when the first of them arrives —
the event order, and so every number, is the same however they are stacked.

A server update is what a synchronous run calls a round: metrics.csv has one training row per update (its
staleness, the bytes since the last one, ``sim_time``) and evaluations every ``train.eval_every`` updates. A
checkpoint holds the whole event queue (:class:`EventQueue`: the clients in flight, the buffer, the trained
updates not merged yet and the model versions they need), so a resumed run continues event for event.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from hetfed.engine.rng import ASYNC_DISPATCH, numpy_rng
from hetfed.engine.types import Params, ServerState, Upload, concat_uploads
from hetfed.errors import RunError

if TYPE_CHECKING:
    from hetfed.algorithms._async import Asynchronous
    from hetfed.executors.updates import SimulationResult, _Loop


@dataclass(order=True, frozen=True)
class Job:
    """A client sent model ``version`` at ``sent``; it arrives at ``arrival`` (``seq``: the send counter)."""

    arrival: float
    seq: int
    client: int = field(compare=False)
    version: int = field(compare=False)
    sent: float = field(compare=False, default=0.0)
    up_bytes: int = field(compare=False, default=0)  # what its update will carry


@dataclass
class EventQueue:
    """Everything between two server updates that a checkpoint must keep."""

    now: float = 0.0
    version: int = 0
    sent: int = 0  # jobs sent so far (each client's draw and the tie-break)
    in_flight: list[Job] = field(default_factory=list)  # a heap by (arrival, seq)
    buffer: list[tuple[Job, float]] = field(default_factory=list)  # arrivals not merged yet, with their staleness
    trained: dict[tuple[int, int], Upload] = field(default_factory=dict)  # (version, client) → its one-row update
    rejected: set[tuple[int, int]] = field(default_factory=set)  # updates the screening dropped
    versions: dict[int, Params] = field(default_factory=dict)  # the models in-flight or buffered clients need
    on_version: set[int] = field(default_factory=set)  # clients sent the current version
    last_update: float = 0.0
    up_bytes: int = 0  # since the last update
    down_bytes: int = 0
    rejected_counts: dict[str, int] = field(default_factory=dict)


def run_async(loop: _Loop, result: SimulationResult, finished: bool) -> None:
    """Server updates until ``train.rounds`` of them (or early stopping), from ``result.async_state`` when resumed."""
    from hetfed.executors.updates import wire_bytes

    algo, train = cast("Asynchronous", loop.algo), loop.train
    t0 = time.perf_counter()
    q: EventQueue = result.async_state if result.async_state is not None else EventQueue()
    if result.async_state is None:
        q.versions[0] = result.server.params
        result.async_state = q
    t0 = time.perf_counter()
    while not finished and result.rounds_done < train.rounds:
        # every freed slot is filled before the next arrival (and first thing after a resume: the same draws)
        _fill(loop, result, q, wire_bytes(algo, algo.broadcast(result.server, q.version)))
        if not q.in_flight:
            raise RunError(f"no client is training and the buffer holds {len(q.buffer)} of "
                           f"{algo.buffer} arrivals (the screening rejected the rest); expected fewer rejections "
                           "or a smaller params.buffer")
        job = heapq.heappop(q.in_flight)
        q.now = job.arrival
        _arrive(loop, result, q, job)
        if len(q.buffer) >= algo.buffer:
            finished = _update(loop, result, q, t0)
            t0 = time.perf_counter()


def _fill(loop: _Loop, result: SimulationResult, q: EventQueue, wire: tuple[int, int]) -> None:
    """Send the current version to idle clients until ``concurrency`` are training (or none is left)."""
    algo, clock = cast("Asynchronous", loop.algo), loop.faults.clock
    busy = {j.client for j in q.in_flight}
    eligible = np.flatnonzero(~np.asarray(loop.fed.opted_out, dtype=bool))
    while len(q.in_flight) < algo.params.concurrency:
        idle = [int(k) for k in eligible if int(k) not in busy and int(k) not in q.on_version]
        if not idle:
            return
        k = idle[int(numpy_rng(loop.seed, ASYNC_DISPATCH, q.sent).integers(len(idle)))]
        took = float(clock.times([k], *wire)[0])
        heapq.heappush(q.in_flight, Job(q.now + took, q.sent, k, q.version, q.now, wire[1]))
        q.sent += 1
        q.down_bytes += wire[0]
        q.on_version.add(k)
        busy.add(k)


def _arrive(loop: _Loop, result: SimulationResult, q: EventQueue, job: Job) -> None:
    """Train the arrival's version stack if it has not been, and put the arrival in the buffer (or drop it)."""
    key = (job.version, job.client)
    q.up_bytes += job.up_bytes
    if key not in q.trained and key not in q.rejected:
        _train_version(loop, result, q, job.version, job.client)
    if key in q.rejected:
        q.rejected.discard(key)
        return
    q.buffer.append((job, float(q.version - job.version)))


def _train_version(loop: _Loop, result: SimulationResult, q: EventQueue, version: int, arriving: int) -> None:
    """Every client sent ``version`` whose update is not computed yet (``arriving``, just taken off the queue, and
    those still in flight), as one stack through the executor."""
    waiting = {j.client for j in q.in_flight if j.version == version} | {arriving}
    clients = sorted(k for k in waiting if (version, k) not in q.trained and (version, k) not in q.rejected)
    bc = loop.algo.broadcast(ServerState(q.versions[version], version, result.server.extra), version)
    upload = loop.executor.train(bc, clients)
    for reason, n in upload.screened.items():
        q.rejected_counts[reason] = q.rejected_counts.get(reason, 0) + n
    rows = {k: j for j, k in enumerate(upload.client_ids)}
    for k in clients:
        if k not in rows:
            q.rejected.add((version, k))
            continue
        j = rows[k]
        q.trained[(version, k)] = Upload([k], {n: v[j : j + 1] for n, v in upload.params.items()},
                                         upload.num_samples[j : j + 1], {n: v[j : j + 1] for n, v in upload.extra.items()})


def _update(loop: _Loop, result: SimulationResult, q: EventQueue, t0: float) -> bool:
    """Merge the buffer into a new version, tell the observers, evaluate and checkpoint when due; True to stop."""
    from hetfed.executors.updates import after_update

    algo = cast("Asynchronous", loop.algo)
    jobs = [job for job, _ in q.buffer]
    staleness = np.array([s for _, s in q.buffer])
    arrivals = concat_uploads([q.trained.pop((job.version, job.client)) for job in jobs])
    starts = {name: torch.stack([q.versions[job.version][name] for job in jobs]) for name in result.server.params}
    t_server = time.perf_counter()
    result.server = algo.merge(result.server, arrivals, starts, staleness)
    result.server_seconds += time.perf_counter() - t_server
    q.version += 1
    q.buffer = []
    q.on_version = set()
    needed = {j.version for j in q.in_flight} | {q.version}
    q.versions = {v: p for v, p in q.versions.items() if v in needed}
    q.versions[q.version] = result.server.params
    counts = {"clients_aggregated": len(jobs), **{f"clients_{r}": n for r, n in q.rejected_counts.items()}}
    clock = {"round_time": q.now - q.last_update, "sim_time": q.now, "downlink_bytes": q.down_bytes,
             "uplink_bytes": q.up_bytes, "staleness_mean": float(staleness.mean()),
             "staleness_max": float(staleness.max())}
    result.sim_time, result.round_time = q.now, q.now - q.last_update
    result.round_bytes = (q.down_bytes, q.up_bytes)
    result.downlink_bytes += q.down_bytes
    result.uplink_bytes += q.up_bytes
    q.last_update, q.down_bytes, q.up_bytes, q.rejected_counts = q.now, 0, 0, {}
    return after_update(loop, result, arrivals, counts, clock, t0)


def describe(q: Any) -> dict[str, Any]:
    """The queue's state in numbers (tests, the progress line)."""
    return {"now": q.now, "version": q.version, "in_flight": len(q.in_flight), "buffered": len(q.buffer)}
