"""A stacked sweep's clients' work: the runs' requests that share a client computation, answered as one stack of
clients across runs (:mod:`hetfed.executors.stacked_runs` groups them).

:func:`train_together` runs a round's client steps of every run of the group as stacks of clients, each client with
its own run's broadcast, data and seed, and hands each run its share: through the run's own transport, measured for
its screen (:func:`_measured`), collected as the run's own round. :func:`evaluate_together` scores every run's
clients in stacks, each on its own run's validation, test and global test sets (the runs' pools and global sets
joined, :func:`_joint_pool`). A client's numbers do not depend on its stack, so each run gets what it computes alone.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Container, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np
import torch

from hetfed.engine.evaluate import ClientEvalData
from hetfed.engine.faults import Adversary, Colluding
from hetfed.engine.rng import derive_seeds
from hetfed.engine.sampling import global_scorers
from hetfed.engine.types import Broadcast, ClientBroadcast, ClientData, ClientState, RoundUploads, Upload
from hetfed.executors.inprocess import InProcessExecutor, eval_chunk, seed_rows
from hetfed.server.screen import Measured, Screen, measure, select

#: a joined pool: (x, y, each run's offset, the runs' own (x, y) it was joined from)
_Pool = tuple[torch.Tensor, torch.Tensor, list[int], tuple[Any, ...]]
#: what a joined pool is kept under: each run's (features, labels) tensors' ids
_PoolKey = tuple[tuple[int, int], ...]


@dataclass
class Joined:
    """What the joined computations keep between rounds (one per stacked sweep)."""

    #: the joined train pools of the runs that last stepped together (rebuilt when the set changes)
    pools: dict[_PoolKey, _Pool] = field(default_factory=dict)
    #: the same for their global test sets (a joined evaluation)
    global_sets: dict[_PoolKey, _Pool] = field(default_factory=dict)
    #: the joined pools of a round some of whose runs' malicious clients train on the pool as their attack made it
    poisoned: dict[_PoolKey, _Pool] = field(default_factory=dict)
    #: a run's clients' evaluation index arrays moved to its offsets in the joined pools: executor → offsets →
    #: arrays; weakly keyed, so a finished method's executor (its pool and states) is not kept alive by them
    shifted: weakref.WeakKeyDictionary[InProcessExecutor, dict[Any, tuple[Any, ...]]] = field(
        default_factory=weakref.WeakKeyDictionary)


class Asking(Protocol):
    """A run's request waiting in the lockstep (:class:`hetfed.executors.stacked_runs.Rendezvous`): what the joined
    computations read of it."""

    @property
    def executor(self) -> InProcessExecutor: ...

    @property
    def bc(self) -> Broadcast: ...

    @property
    def clients(self) -> list[int]: ...

    @property
    def view(self) -> str | None: ...

    @property
    def joined(self) -> Joined: ...


def joins(executor: InProcessExecutor, bc: Broadcast) -> bool:
    """Whether this run's round (or evaluation) may share a stack with other runs: its algorithm reads the broadcast
    only as ``bc.stacked(n)``, ``bc.extra_rows`` and its clients' personal rows (``Capabilities.stacks_runs``) and
    every extra is a number or tensors. The others step alone: their executor's own round."""
    return executor.algo.capabilities.stacks_runs and all(map(_joinable, bc.extra.values()))


def _joinable(value: Any) -> bool:
    return _shared(value) or isinstance(value, torch.Tensor) or (
        isinstance(value, dict) and all(isinstance(v, torch.Tensor) for v in value.values()))


def _shared(value: Any) -> bool:
    """A number in the broadcast's extras (FedDBE's "known", FedGen's α): every client of a joined stack shares it,
    so only runs whose numbers are equal join; tensors travel as each client's run's rows."""
    return isinstance(value, int | float) or (isinstance(value, torch.Tensor) and value.dim() == 0)


def _extra_key(bc: Broadcast, read: Container[str] | None = None) -> Any:
    """The extras' part of a stack's key: the numbers' values, the tensors' shapes and types, and the personal rows'
    (a row's: the runs' clients are joined along the rows); ``read``: only these extras are read (None: all)."""
    def layout(v: torch.Tensor) -> Any:
        return tuple(v.shape), v.dtype

    def part(v: Any) -> Any:
        if _shared(v):
            return float(v)
        return tuple(sorted((n, layout(t)) for n, t in v.items())) if isinstance(v, dict) else layout(v)

    return (tuple(sorted((k, part(v)) for k, v in bc.extra.items() if read is None or k in read)),
            tuple(sorted((k, layout(v[0:0])) for k, v in bc.personal.items())))


def step_key(executor: InProcessExecutor, bc: Broadcast) -> Any:
    """Requests with equal keys run the same client step and share a stack (every request :func:`joins`): their
    runs' specifications agree on the client step (:meth:`~hetfed.run_spec.RunSpec.step_identity`), on this device,
    for the same broadcast names, client states' names (runs of different methods that share a step: FedAvg's and
    kNN-Per's), learning rate, round and extras' numbers and shapes."""
    return (executor.run.step_identity(), str(executor.device), tuple(sorted(bc.params)),
            tuple(sorted(executor.states.names())), float(bc.lr), bc.round, _extra_key(bc))


def evaluation_key(executor: InProcessExecutor, bc: Broadcast, view: str | None) -> Any:
    """Evaluations with equal keys score the same kind of model the same way and may share a stack: the same
    scoring (:meth:`~hetfed.run_spec.RunSpec.scoring_identity`: the method and model, or for methods whose clients
    score the model sent, that network — a sweep's FedAvg, FedProx and SCAFFOLD runs — and the model's own names
    their clients hold), view, number of classes, global test set size and the numbers and shapes of the extras the
    scoring reads (each client scores its own run's)."""
    run = executor.run
    reported = run.algo.capabilities.reports
    read = None if not run.scores_the_broadcast else () if reported is None else (reported,)
    # the model's own names its clients hold (FFA-LoRA's frozen A), which they predict with in place of the sent ones
    held = tuple(sorted(executor.states.names() & run.parameter_names)) if run.scores_the_broadcast else ()
    return (run.scoring_identity(), str(executor.device), tuple(sorted(bc.params)), held, view,
            executor.fed.n_classes, len(executor.y_global), tuple(executor.x_global.shape[1:]),
            executor.eval_max_floats, _extra_key(bc, read))


def train_together(group: Sequence[Asking]) -> list[Upload]:
    """One round of every request of ``group`` (the same client step): their clients in stacks of similar
    local steps across runs; each run's uploads screened and collected as its own round."""
    lead = group[0].executor
    algo = lead.algo
    rnd = group[0].bc.round  # every run's (the stack's key)
    attackers = [r.executor.attacker(rnd) for r in group]
    poisoned = any(r.executor.poisoned_pool(rnd) is not None for r in group)
    pool_x, pool_y, offsets = _joint_pool([r.executor for r in group],
                                          group[0].joined.poisoned if poisoned else group[0].joined.pools,
                                          lambda e: e.poisoned_pool(rnd) or (e.pool.x, e.pool.y))
    entries = [(i, k) for i, r in enumerate(group) for k in r.clients]
    for r in group:
        r.executor._ensure_residuals(r.bc.params)
    rounds = [r.executor.round_receiving(r.bc) for r in group]
    schedule = lead.run.schedule
    steps = [schedule.n_steps(len(group[i].executor.pool.train[k])) for i, k in entries]
    for block in lead.blocks(steps, lead.chunk_size(algo.model, schedule.batch_size)):
        members = sorted(block, key=lambda e: entries[e])  # each run's clients together, in its own order
        _train_block(group, [entries[e] for e in members], pool_x, pool_y, offsets, rounds, attackers)
    return [r.result(False) for r in rounds]


def _joined_state(group: Sequence[Asking], runs: list[int], chosen: dict[int, list[int]],
                  only: Container[str] | None = None) -> tuple[ClientState, ClientBroadcast]:
    """The chosen clients' states as the algorithm sees them (without the transport's residuals) and broadcast
    parameters, run after run, as one stack; ``only``: those state names alone (an evaluation of the model sent reads
    only the model's own names that clients hold — FFA-LoRA's frozen A —, not SCAFFOLD's control variates: runs of
    methods whose clients keep other states score in one stack)."""
    states = [group[i].executor._stacked(chosen[i], only) for i in runs]
    state = {k: torch.cat([s[k] for s in states]) for k in states[0]} if states and states[0] else {}
    shared = [group[i].bc.stacked(len(chosen[i])) for i in runs]
    first = group[0].bc
    personal = [group[i].bc.for_clients(chosen[i], group[i].executor.device).personal for i in runs]
    bc = ClientBroadcast({k: torch.cat([p[k] for p in shared]) for k in first.params}, first.round, first.lr,
                         {k: v for k, v in first.extra.items() if _shared(v)},
                         {k: torch.cat([p[k] for p in personal]) for k in first.personal},
                         tuple(k for i in runs for k in chosen[i]) if first.personal else None,
                         row_extra={key: functools.cache(functools.partial(_joined_rows, group, runs, chosen, key))
                                    for key, value in first.extra.items() if not _shared(value)})
    return state, bc


def _joined_rows(group: Sequence[Asking], runs: list[int], chosen: dict[int, list[int]], key: str) -> Any:
    """The tensor extra ``key`` as the joined stack's rows, each client its own run's: built only when the step (or
    the evaluation) reads it."""
    parts = [group[i].bc.extra_rows(key, len(chosen[i])) for i in runs]
    return {n: torch.cat([p[n] for p in parts]) for n in parts[0]} if isinstance(parts[0], dict) else torch.cat(parts)


def _train_block(group: Sequence[Asking], members: list[tuple[int, int]], x: torch.Tensor, y: torch.Tensor,
                 offsets: list[int], rounds: list[RoundUploads | Colluding],
                 attackers: list[Adversary | None]) -> None:
    algo = group[0].executor.algo
    chosen = _by_run(members)
    runs = list(chosen)
    state, bc = _joined_state(group, runs, chosen)
    # as alone, every run's clients' seeds hashed at once (a run's ten clients alone go one by one)
    seeds = iter(derive_seeds([row for i in runs
                               for row in seed_rows(group[i].executor.pool, chosen[i], group[i].bc.round)]))
    own_seeds = {i: [next(seeds) for _ in chosen[i]] for i in runs}
    shifted = {i: _shifted_train(group[i].executor, offsets[i], group[i].joined.shifted) for i in runs}
    data = ClientData([k + group[i].executor.pool.first_id for i in runs for k in chosen[i]], x, y,
                      [shifted[i][k] for i in runs for k in chosen[i]],
                      [seed for i in runs for seed in own_seeds[i]])
    upload, new = algo.local_update(bc, state, data)
    measured = None if any(attackers[i] is not None for i in runs) else _measured(group, runs, chosen, upload, bc,
                                                                                cast(list[RoundUploads], rounds))
    verdicts = _verdicts(group, runs, chosen, measured, cast(list[RoundUploads], rounds))
    start = 0
    for i, verdict in zip(runs, verdicts, strict=True):
        executor = group[i].executor
        rows = slice(start, start + len(chosen[i]))
        start += len(chosen[i])
        mine = {k: v[rows] for k, v in new.items()}
        part = Upload(upload.client_ids[rows], {k: v[rows] for k, v in upload.params.items()},
                      upload.num_samples[rows], {k: v[rows] for k, v in upload.extra.items()})
        attacker = attackers[i]
        if attacker is not None:  # its malicious clients' change to their own uploads, as alone
            part = attacker.poison(part, group[i].bc)
        # the run's own transport (compression, its clients' residuals), as its executor applies it alone
        residual = executor._residuals(chosen[i]) if executor.transport.error_feedback else {}
        part, residual = executor.transport.send(part, group[i].bc.params, residual, own_seeds[i],
                                                 still_read=tuple(mine.values()))
        executor._keep(chosen[i], mine, residual)
        if verdict is not None:
            cast(RoundUploads, rounds[i]).add(select(part, verdict), judged=True)
        else:
            rounds[i].add(part, measured.rows(rows) if measured is not None else None)


def _by_run(members: Sequence[tuple[int, int]]) -> dict[int, list[int]]:
    """A block's (run, client) pairs as each run's clients in the block's order, runs in order: one pass (a
    20-seed round's 200 clients filtered once a run were 4 000 tests a block)."""
    chosen: dict[int, list[int]] = {}
    for i, k in members:
        chosen.setdefault(i, []).append(k)
    return dict(sorted(chosen.items()))


def _shifted_train(executor: InProcessExecutor, offset: int,
                   cache: weakref.WeakKeyDictionary[InProcessExecutor, dict[Any, tuple[Any, ...]]]
                   ) -> tuple[Any, ...]:
    """A run's clients' training index arrays (its pool's) moved by ``offset``, its place in the joined pool: the
    same arrays every round, kept (and shared with its evaluations, :func:`_shifted`)."""
    mine = cache.setdefault(executor, {})
    key = ("train", offset)
    if key not in mine:
        mine[key] = tuple(t + offset for t in executor.pool.train)
    return mine[key]


def _measured(group: Sequence[Asking], runs: list[int], chosen: dict[int, list[int]], upload: Upload,
              bc: ClientBroadcast, rounds: list[RoundUploads]) -> Measured | None:
    """The block's updates' finite flags and update norms, each client against its own run's broadcast, in one pass
    for all its runs (each run's screen measured its own part: ~0.1 ms a run) — when every part reaches its screen
    as uploaded (no compression), no screen clips (DP) and the parts are of one size, so that the norms are taken in
    each part's own slices: every number as the run's screen measures it alone. None: each run's screen measures its
    part."""
    screens = [rounds[i].screen for i in runs]
    sizes = {len(chosen[i]) for i in runs}
    if (len(sizes) != 1 or any(s is None or s.clip is not None for s in screens)
            or any(group[i].executor.transport.compressor is not None for i in runs)):
        return None
    reference = {k: bc.params[k] for k in screens[0].reference}
    return measure(upload, reference, sizes.pop(), norms=any(s.norm_factor is not None for s in screens))


def _verdicts(group: Sequence[Asking], runs: list[int], chosen: dict[int, list[int]], measured: Measured | None,
              rounds: list[RoundUploads]) -> list[torch.Tensor | None]:
    """Each run's screen's verdict on its part of the block, every screen's in one pass
    (:meth:`~hetfed.server.screen.Screen.verdicts`) — when the block holds every run's whole round, measured, and no
    screen has held or judged an update of it yet (the round's one chunk: what its screen decides of it alone). None
    each otherwise: each run's screen admits its part."""
    if measured is None or any(len(chosen[i]) != len(group[i].clients) for i in runs):  # measured: no attack
        return [None] * len(runs)
    screens = [rounds[i].screen for i in runs]
    if not all(s is not None and s.fresh for s in screens):
        return [None] * len(runs)
    return list(Screen.verdicts(cast(list[Screen], screens), measured))


def evaluate_together(group: Sequence[Asking]) -> list[dict[str, list[Any]]]:
    """Every request's evaluation (the same method, model and view) in stacks of clients across runs: each client
    with its own run's model, states, validation, test and global test sets; each run's reports in its clients'
    order, as :meth:`~hetfed.executors.inprocess.InProcessExecutor.evaluate` gives them alone."""
    lead = group[0].executor
    joined = group[0].joined
    executors = [r.executor for r in group]
    pool_x, pool_y, offsets = _joint_pool(executors, joined.pools)
    global_x, global_y, global_offsets = _joint_pool(executors, joined.global_sets,
                                                     lambda e: (e.x_global, e.y_global))
    entries = [(i, k) for i, r in enumerate(group) for k in r.clients]
    size = min(_eval_chunk(r) for r in group)
    reports: list[dict[str, list[Any]]] = [{} for _ in group]
    scorers = [_global_scorers(r) for r in group]
    for start in range(0, len(entries), size):
        chosen = _by_run(entries[start : start + size])
        runs = list(chosen)
        state, bc = _joined_state(group, runs, chosen, lead.run.parameter_names if lead.run.scores_the_broadcast
                                  else None)
        sets = {i: _shifted(group[i].executor, offsets[i], global_offsets[i], joined.shifted) for i in runs}
        data = ClientEvalData(
            [k + group[i].executor.pool.first_id for i in runs for k in chosen[i]], pool_x, pool_y,
            [sets[i][0][k] for i in runs for k in chosen[i]], [sets[i][1][k] for i in runs for k in chosen[i]],
            global_x, global_y, lead.fed.n_classes,
            None if all(scorers[i] is None for i in runs) else
            [(scorers[i] or {}).get(k, True) for i in runs for k in chosen[i]],
            [sets[i][2][k] for i in runs for k in chosen[i]], [sets[i][3] for i in runs for _k in chosen[i]])
        out = lead.algo.evaluate_client(bc, state, data, group[0].view)
        at = 0
        for i in runs:
            rows = slice(at, at + len(chosen[i]))
            at += len(chosen[i])
            for key, values in out.items():
                reports[i].setdefault(key, []).extend(values[rows])
    return reports


def _eval_chunk(request: Asking) -> int:
    """The request's run's :func:`~hetfed.executors.inprocess.eval_chunk` for its clients (kept: the same clients
    every evaluation, and each run's took ~30 µs of lengths read one by one)."""
    executor = request.executor
    mine = request.joined.shifted.setdefault(executor, {})
    clients = tuple(request.clients)
    kept = mine.get("eval chunk")
    if kept is None or kept[0] != clients:  # one entry a run: its last clients
        kept = mine["eval chunk"] = (clients, eval_chunk(executor.fed, request.clients, executor.pool.x,
                                                         executor.fed.n_classes, executor.eval_max_floats))
    return int(kept[1])


def _global_scorers(request: Asking) -> dict[int, bool] | None:
    """Which of a request's clients score the global test set with a personal model (None: all), as alone."""
    executor = request.executor
    if request.view:
        return None
    ids = [k + executor.pool.first_id for k in request.clients]
    mask = global_scorers(executor.run.train, ids, executor.seed)
    return None if mask is None else dict(zip(request.clients, mask, strict=True))


def _shifted(executor: InProcessExecutor, offset: int, global_offset: int,
             cache: weakref.WeakKeyDictionary[InProcessExecutor, dict[Any, tuple[Any, ...]]]
             ) -> tuple[Any, ...]:
    """A run's clients' test, validation and training index arrays moved by ``offset`` (its place in the joined
    pool) and its global test set's rows in the joined global sets (kept: the same arrays every evaluation; the
    training arrays are the ones its joined steps read, :func:`_shifted_train`)."""
    mine = cache.setdefault(executor, {})
    cached = mine.get((offset, global_offset))
    if cached is None:
        fed = executor.fed
        cached = (tuple(t + offset for t in fed.test), tuple(v + offset for v in fed.val),
                  _shifted_train(executor, offset, cache), np.arange(len(executor.y_global)) + global_offset)
        mine[(offset, global_offset)] = cached
    return cached


def _joint_pool(executors: Sequence[InProcessExecutor], cache: dict[_PoolKey, _Pool],
                part: Any = None) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The runs' train pools (or ``part(executor)``'s tensors: their global test sets) one after the other (shared
    when they are the very same), and each one's offset."""
    tensors = [(e.pool.x, e.pool.y) if part is None else part(e) for e in executors]
    # by features and labels: a label-flipping attack trains on the pool's features with labels of its own
    key = tuple((id(x), id(y)) for x, y in tensors)
    cached = cache.get(key)
    if cached is not None and all(a is x and b is y for (a, b), (x, y) in zip(cached[3], tensors, strict=True)):
        return cached[0], cached[1], cached[2]
    xs: list[torch.Tensor] = []
    ys: list[torch.Tensor] = []
    offsets: list[int] = []
    seen: dict[tuple[int, int], int] = {}
    total = 0
    for x, y in tensors:
        same = seen.get((id(x), id(y)))
        if same is not None:
            offsets.append(same)
            continue
        seen[(id(x), id(y))] = total
        offsets.append(total)
        xs.append(x)
        ys.append(y)
        total += len(x)
    joint = (torch.cat(xs), torch.cat(ys), offsets) if len(xs) > 1 else (xs[0], ys[0], offsets)
    cache.clear()  # the pools of one set of runs at a time
    cache[key] = (*joint, tuple(tensors))
    return joint
