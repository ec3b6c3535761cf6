"""The asynchronous server's event loop on the simulated clock (FedBuff, FedAsync: ``Capabilities.asynchronous``).

``concurrency`` M clients train at once. A client sent model version v at time t arrives at t plus its round on
the clock (:class:`hetfed.engine.clock.Clock`: compute + network); arrivals are taken in time order (ties: in the
order they were sent), each one's staleness is the server updates made since v, and every ``buffer`` K arrivals
the algorithm merges them (:meth:`hetfed.algorithms._async.Asynchronous.merge`, through its server chain) into a
new version. Each arrival frees its slot, and a client that is idle and has not yet trained on the current version
is drawn (uniformly, from the run seed and the send counter) to fill it.

Vectorised: training is lazy. A client's update depends only on the version it was sent and its own streams
(keyed by run seed, version and client id, like a synchronous round's), not on when it runs, so updates are
computed when a merge needs them — when the buffer holds K arrivals — every client pending then in one stack (the
clients sent over about a buffer's arrivals, of whatever versions) — the event order, and so every number, is the
same however they are stacked.

A server update is what a synchronous run calls a round: metrics.csv has one training row per update (its
staleness, the bytes since the last one, ``sim_time``) and evaluations every ``train.eval_every`` updates. A
checkpoint holds the whole event queue (:class:`EventQueue`: the clients in flight, the buffer, the trained
updates not merged yet and the model versions they need), so a resumed run continues event for event.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import torch

from hetfed.engine.latency import LATENCY
from hetfed.engine.rng import ASYNC_DISPATCH
from hetfed.engine.types import (
    Broadcast,
    ClientBroadcast,
    Params,
    ServerState,
    Upload,
    concat_uploads,
)
from hetfed.errors import RunError
from hetfed.executors.inprocess import RoundSkipped
from hetfed.executors.updates import after_update, drive, wire_bytes
from hetfed.server.screen import finite_clients, update_norms

if TYPE_CHECKING:
    from hetfed.algorithms._async import Asynchronous
    from hetfed.executors.updates import SimulationResult, _Loop


class Dispatching(Protocol):
    """An executor that sends clients their training messages when the server sends them the model, and takes the
    replies later (Flower: :meth:`hetfed.flower.executor.FlowerExecutor.dispatch`)."""

    def dispatch(self, bc: Broadcast, clients: list[int]) -> list[Any]: ...
    def collect(self, sent: Any) -> Upload: ...
    def first_replied(self, sent: list[Any]) -> Any: ...


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
    #: (version, client) → its update: a row of a stack's screened upload (materialised when merged)
    trained: dict[tuple[int, int], tuple[Upload, int]] = field(default_factory=dict)
    rejected: set[tuple[int, int]] = field(default_factory=set)  # updates dropped: screened out, or lost
    lost: set[tuple[int, int]] = field(default_factory=set)  # of those, the ones whose replies never came
    versions: dict[int, Params] = field(default_factory=dict)  # the models in-flight or buffered clients need
    on_version: set[int] = field(default_factory=set)  # clients sent the current version
    last_update: float = 0.0
    up_bytes: int = 0  # since the last update
    down_bytes: int = 0
    rejected_counts: dict[str, int] = field(default_factory=dict)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A checkpoint's queue; one written before ``lost`` existed counted its losses when they happened."""
        self.__dict__.update({"lost": set(), **state})


def run_async(loop: _Loop, result: SimulationResult, finished: bool) -> None:
    """Server updates until ``train.rounds`` of them (or early stopping), from ``result.async_state`` when resumed."""
    algo, train = cast("Asynchronous", loop.algo), loop.train
    q: EventQueue = result.async_state if result.async_state is not None else EventQueue()
    if result.async_state is None:
        q.versions[0] = result.server.params
        result.async_state = q
    t0 = time.perf_counter()
    wire: tuple[int, tuple[int, int]] | None = None  # (version, its bytes down and up per client)
    taking_part = [k for k, out in enumerate(np.asarray(loop.fed.opted_out).tolist()) if not out]
    pushed: dict[tuple[int, int], Any] = {}  # (version, client) → its training messages in flight (not checkpointed)
    origin = time.monotonic() - q.now  # wall: the run's seconds go on from a checkpoint's
    if _wall(loop):  # a resumed run's messages in flight are gone: sent again
        lost = [j for j in q.in_flight if j.arrival == math.inf]
        for version in sorted({j.version for j in lost}):
            _dispatch(loop, result, q, version, [j.client for j in lost if j.version == version], pushed)
    while not finished and result.rounds_done < train.rounds:
        # every freed slot is filled before the next arrival (and first thing after a resume: the same draws)
        if wire is None or wire[0] != q.version:
            wire = (q.version, wire_bytes(loop.run, algo.broadcast(result.server, q.version)))
        _fill(loop, result, q, wire[1], taking_part, pushed)
        if not q.in_flight:
            raise RunError(f"no client is training and the buffer holds {len(q.buffer)} of "
                           f"{algo.buffer} arrivals (the screening rejected the rest); expected fewer rejections "
                           "or a smaller params.buffer")
        if q.in_flight[0].arrival == math.inf:  # wall: the next arrivals are the next messages to reply
            _replied(loop, q, pushed, origin)
        job = heapq.heappop(q.in_flight)
        q.now = job.arrival
        _arrive(loop, result, q, job, pushed)
        if len(q.buffer) >= algo.buffer and _settled(loop, result, q, pushed):
            finished = _update(loop, result, q, t0)
            t0 = time.perf_counter()


def _fill(loop: _Loop, result: SimulationResult, q: EventQueue, wire: tuple[int, int], taking_part: list[int],
          pushed: dict[tuple[int, int], Any]) -> None:
    """Send the current version to idle clients (of ``taking_part``: those not opted out) until ``concurrency``
    are training (or none is left). An executor that can (Flower: ``dispatch``) gets their training messages now,
    so they train while the loop goes on (``pushed``); others train them when the first arrives (:func:`_arrive`)."""
    algo, clock = cast("Asynchronous", loop.algo), loop.faults.clock
    if len(q.in_flight) >= algo.params.concurrency:
        return
    busy = {j.client for j in q.in_flight} | q.on_version
    idle = [k for k in taking_part if k not in busy]
    sent = []
    while len(q.in_flight) < algo.params.concurrency and idle:
        k = idle.pop(_draw(loop.seed, q.sent, len(idle)))
        took = math.inf if _wall(loop) else float(clock.times([k], *wire)[0])  # wall: known when its reply comes
        heapq.heappush(q.in_flight, Job(q.now + took, q.sent, k, q.version, q.now, wire[1]))
        q.sent += 1
        q.down_bytes += wire[0]
        q.on_version.add(k)
        sent.append(k)
    if sent:
        _dispatch(loop, result, q, q.version, sent, pushed)


def _dispatch(loop: _Loop, result: SimulationResult, q: EventQueue, version: int, clients: list[int],
              pushed: dict[tuple[int, int], Any]) -> None:
    """Hand ``clients`` (sent ``version``) their training now where the executor takes it so (``dispatch``)."""
    dispatch = getattr(loop.executor, "dispatch", None)
    if dispatch is not None:
        for messages in dispatch(_broadcast(loop, result, q, version), sorted(clients)):
            pushed.update({(version, k): messages for k in messages.clients})


def _wall(loop: _Loop) -> bool:
    """Arrivals in the order replies really come (``train.clock.latency = 'wall'``), not by a latency model."""
    return LATENCY.get(loop.train.clock.latency).wall


def _replied(loop: _Loop, q: EventQueue, pushed: dict[tuple[int, int], Any], origin: float) -> None:
    """Wall clock: wait for the next message in flight to reply; its clients arrive now (the run's seconds since
    ``origin``, a ``time.monotonic()``), the others' arrivals stay unknown."""
    waiting = list({id(m): m for m in pushed.values()}.values())
    if not waiting:
        raise RunError("train.clock.latency = 'wall': clients are in flight but no message was pushed to them")
    first = cast(Dispatching, loop.executor).first_replied(waiting)
    now = time.monotonic() - origin
    arrived = {(first.bc.round, k) for k in first.clients}
    q.in_flight = [replace(j, arrival=now) if (j.version, j.client) in arrived else j for j in q.in_flight]
    heapq.heapify(q.in_flight)


def _broadcast(loop: _Loop, result: SimulationResult, q: EventQueue, version: int) -> Broadcast:
    """What the clients sent ``version`` receive."""
    return loop.algo.broadcast(ServerState(q.versions[version], version, result.server.extra), version)


def _draw(seed: int, sent: int, n: int) -> int:
    """Which of ``n`` idle clients the ``sent``-th send goes to: splitmix64 of (run seed, ASYNC_DISPATCH, sent) —
    a pure function of them (a NumPy generator per send cost more than the rest of the event loop)."""
    mask = (1 << 64) - 1
    z = (seed * 0x9E3779B97F4A7C15 + ASYNC_DISPATCH * 0xBF58476D1CE4E5B9 + sent * 0x94D049BB133111EB) & mask
    for _ in range(2):
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z ^= z >> 31
    return z % n


def _arrive(loop: _Loop, result: SimulationResult, q: EventQueue, job: Job, pushed: dict[tuple[int, int], Any]
            ) -> None:
    """Put the arrival in the buffer (or drop it): its update is its messages' replies when it was pushed; else it
    is computed when the buffer is full (:func:`_settled`), with every other client pending — or now, where the
    executor computes at dispatch (its clients sent before a resume)."""
    key = (job.version, job.client)
    q.up_bytes += job.up_bytes
    if key not in q.trained and key not in q.rejected:
        if key in pushed:
            _collect(loop, q, pushed[key], pushed)
        elif hasattr(loop.executor, "dispatch"):
            _train_pending(loop, result, q, [job], pushed)
    if key in q.rejected:
        _drop(q, key)
        return
    q.buffer.append((job, float(q.version - job.version)))


def _drop(q: EventQueue, key: tuple[int, int]) -> None:
    """An arrival whose update was dropped, counted now — when it arrives, whenever it was computed — so each
    merge's row counts the arrivals it saw, on every executor (computed lazily, or when sent as on Flower)."""
    q.rejected.discard(key)
    lost = key in q.lost
    q.lost.discard(key)
    _count(q, {"lost" if lost else "rejected_nonfinite": 1})


def _settled(loop: _Loop, result: SimulationResult, q: EventQueue, pushed: dict[tuple[int, int], Any]) -> bool:
    """A full buffer's updates, every one computed: those not computed yet train now, in one stack with every
    client pending (:func:`_train_pending`); those the screening drops (non-finite) leave the buffer. True when it
    is still full: merge. Else the loop takes the next arrivals — the merge comes at the arrival it came at when
    each update was computed as it arrived, so no number depends on when they are computed; but a stack holds the
    clients sent over a whole buffer (about K), not over the arrivals since the last one that needed training. A
    client whose updates from two versions wait trains them in version order, in two stacks: one stack holds a
    client once (its state, and its row in the upload)."""
    waiting = sorted((job for job, _ in q.buffer if (job.version, job.client) not in q.trained),
                     key=lambda j: j.version)
    if not waiting:
        return True
    while waiting:  # a client that arrived twice (from two versions) trains its updates one after the other
        first: dict[int, Job] = {}
        for job in waiting:
            first.setdefault(job.client, job)
        _train_pending(loop, result, q, list(first.values()), pushed)
        waiting = [job for job in waiting if first[job.client] is not job]
    kept = [(job, s) for job, s in q.buffer if (job.version, job.client) not in q.rejected]
    for job, _ in q.buffer:
        if (job.version, job.client) in q.rejected:
            _drop(q, (job.version, job.client))
    q.buffer = kept
    return len(q.buffer) >= cast("Asynchronous", loop.algo).buffer


def _collect(loop: _Loop, q: EventQueue, messages: Any, pushed: dict[tuple[int, int], Any]) -> None:
    """The replies to a dispatch (every client it named, all sent one version), screened, kept for their
    arrivals."""
    version = messages.bc.round
    upload = _or_lost(lambda: cast(Dispatching, loop.executor).collect(messages))
    for k in messages.clients:
        pushed.pop((version, k), None)
    _keep_rows(q, version, messages.clients, upload)


def _train_pending(loop: _Loop, result: SimulationResult, q: EventQueue, needed: list[Job],
                   pushed: dict[tuple[int, int], Any]) -> None:
    """The ``needed`` updates (arrived, not computed yet) and every client still in flight whose update is not
    computed yet, whatever version each was sent, as one stack, when the algorithm's client step allows clients of
    different broadcasts in one stack (``Capabilities.stacks_runs``) and they share a learning rate; else version
    by version (:func:`_train_version`) — which is also how the clients pending on one version train (a
    synchronous round's path: no model copied per client). A client in flight that also has a needed update (sent
    again since it arrived) waits for its next training: a client's updates are computed in the order it was sent
    them. Updates holding NaN/inf are dropped here; the norm filter judges the buffer at the merge (:func:`_update`)."""
    algo, executor = loop.algo, loop.executor
    again = {j.client for j in needed}
    pending = sorted([j for j in q.in_flight if (j.version, j.client) not in q.trained
                      and (j.version, j.client) not in q.rejected and (j.version, j.client) not in pushed
                      and j.client not in again] + needed, key=lambda j: j.client)
    versions = {j.version for j in pending}
    adversary, train_rows = getattr(executor, "adversary", None), getattr(executor, "train_rows", None)
    mixed = (len(versions) > 1 and algo.capabilities.stacks_runs and train_rows is not None
             and not (adversary is not None and adversary.active))
    sent = {v: _broadcast(loop, result, q, v) for v in versions} if mixed else {}
    if not mixed or len({b.lr for b in sent.values()}) > 1 or any(b.extra for b in sent.values()):
        for version in sorted({j.version for j in needed}):
            _train_version(loop, result, q, version, {j.client for j in needed if j.version == version}, again,
                           pushed)
        return
    first = pending[0].version
    bc = ClientBroadcast({name: torch.stack([q.versions[j.version][name] for j in pending])
                          for name in q.versions[first]}, first, sent[first].lr)
    assert train_rows is not None
    upload = train_rows(bc, [j.client for j in pending], [j.version for j in pending])
    # an asynchronous server's executors only drop non-finite updates (DP is refused; the norm filter judges the
    # buffer at the merge): one check of the whole stack
    finite, row_of = finite_clients(upload).tolist(), {k: i for i, k in enumerate(upload.client_ids)}
    for j in pending:
        if finite[row_of[j.client]]:
            q.trained[(j.version, j.client)] = (upload, row_of[j.client])
        else:
            q.rejected.add((j.version, j.client))


def _count(q: EventQueue, screened: dict[str, int]) -> None:
    for reason, n in screened.items():
        q.rejected_counts[reason] = q.rejected_counts.get(reason, 0) + n


def _keep_rows(q: EventQueue, version: int, clients: list[int], upload: Upload) -> None:
    """Each of ``clients``' one-row update (sent ``version``), or its rejection by the screening (counted when it
    arrives: :func:`_drop`) — or its loss, when the upload is :func:`_or_lost`'s."""
    rows = {k: j for j, k in enumerate(upload.client_ids)}
    lost = upload.screened.get("lost", 0) > 0
    for k in clients:
        if k not in rows:
            q.rejected.add((version, k))
            if lost:
                q.lost.add((version, k))
            continue
        q.trained[(version, k)] = (upload, rows[k])


def _train_version(loop: _Loop, result: SimulationResult, q: EventQueue, version: int, needed: set[int],
                   again: set[int], pushed: dict[tuple[int, int], Any]) -> None:
    """Every client sent ``version`` whose update is not computed yet nor on its way — ``needed`` (arrived) and
    those still in flight, but for those of ``again`` (a needed update of theirs from another version comes
    first) — as one stack through the executor."""
    waiting = {j.client for j in q.in_flight if j.version == version and j.client not in again} | needed
    clients = sorted(k for k in waiting if (version, k) not in q.trained and (version, k) not in q.rejected
                     and (version, k) not in pushed)
    bc = _broadcast(loop, result, q, version)
    upload = _or_lost(lambda: loop.executor.train(bc, clients))
    _keep_rows(q, version, clients, upload)


def _or_lost(replies: Callable[[], Upload]) -> Upload:
    """The clients' upload, or none when too few of them replied (Flower: ``RoundSkipped``): they count as lost,
    like screened-out updates."""
    try:
        return replies()
    except RoundSkipped:
        return Upload([], {}, torch.zeros(0), screened={"lost": 1})


def _rows(at: list[tuple[Upload, int]]) -> Upload:
    """The updates at (screened stack, row), in that order: one selection per stack they came in."""
    stacks: dict[int, tuple[Upload, list[int], list[int]]] = {}  # id(stack) → (stack, its rows, their positions)
    for i, (upload, row) in enumerate(at):
        stacks.setdefault(id(upload), (upload, [], []))[1].append(row)
        stacks[id(upload)][2].append(i)
    parts = [upload.rows_between(rows[0], rows[-1] + 1) if rows == list(range(rows[0], rows[-1] + 1))
             else upload.take(rows) for upload, rows, _ in stacks.values()]  # read only: views where they can be
    joined = concat_uploads(parts)
    order = [i for _, _, positions in stacks.values() for i in positions]
    if order == sorted(order):
        return joined
    return joined.take(sorted(range(len(order)), key=order.__getitem__))


def _update(loop: _Loop, result: SimulationResult, q: EventQueue, t0: float) -> bool:
    """Screen the buffer (the norm filter: :meth:`hetfed.server.chain.Chain.buffer_screen`) and merge what passed into
    a new version (a merge left with fewer than ``server.min_clients`` is skipped: the model stays), tell the
    observers, evaluate and checkpoint when due; True to stop."""
    algo = cast("Asynchronous", loop.algo)
    jobs = [job for job, _ in q.buffer]
    staleness = np.array([s for _, s in q.buffer])
    arrivals = _rows([q.trained.pop((job.version, job.client)) for job in jobs])
    starts = {name: torch.stack([q.versions[job.version][name] for job in jobs]) for name in result.server.params}
    # the norm filter over the buffer, each arrival against the model it was sent
    screen = loop.run.chain.buffer_screen()
    if not screen.only_finite(len(jobs)):
        passed = screen.verdict(torch.ones(len(jobs), dtype=torch.bool), update_norms(arrivals, starts))
        _count(q, screen.counts)
        if not bool(passed.all()):
            keep = torch.nonzero(passed).flatten().tolist()
            jobs, arrivals = [jobs[i] for i in keep], arrivals.take(keep)
            starts, staleness = {k: v[keep] for k, v in starts.items()}, staleness[keep]
    # too few accepted arrivals: the model stays, as a round's would, but the version moves on (clients are sent
    # it again with the next version's streams)
    merged = len(jobs) >= loop.min_clients
    if merged:
        t_server = time.perf_counter()
        result.server = algo.merge(result.server, arrivals, starts, staleness)
        result.server_seconds += time.perf_counter() - t_server
    else:
        result.skipped_rounds.append(result.rounds_done + 1)
    q.version += 1
    q.on_version = set()
    q.buffer = []
    needed = {j.version for j in q.in_flight} | {q.version}
    q.versions = {v: p for v, p in q.versions.items() if v in needed}
    q.versions[q.version] = result.server.params
    counts = {"clients_aggregated": len(jobs) if merged else 0, "round_skipped": int(not merged),
              **{f"clients_{r}": n for r, n in q.rejected_counts.items()}}
    clock = {"round_time": q.now - q.last_update, "sim_time": q.now, "downlink_bytes": q.down_bytes,
             "uplink_bytes": q.up_bytes, "staleness_mean": float(staleness.mean()),
             "staleness_max": float(staleness.max())}
    result.sim_time, result.round_time = q.now, q.now - q.last_update
    result.round_bytes = (q.down_bytes, q.up_bytes)
    result.downlink_bytes += q.down_bytes
    result.uplink_bytes += q.up_bytes
    q.last_update, q.down_bytes, q.up_bytes, q.rejected_counts = q.now, 0, 0, {}
    return drive(after_update(loop, result, arrivals if merged else None, counts, clock, t0), loop.executor)
