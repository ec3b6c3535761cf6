"""Executors run the client-side steps of an algorithm for the chosen clients.

One algorithm definition, several ways to run it. An executor owns where the
clients live and how they are stacked; the algorithm's steps are the same:

- ``train(bc, clients) -> Upload``: each client's ``local_update`` for a round;
- ``personalise(bc, clients) -> info``: the client-side step after federated training;
- ``evaluate(bc, clients, view) -> reports``: each client scores its own model;
  only metrics come back.

In this process:

- :class:`SequentialExecutor`: a plain per-client loop (stacks of one) — the
  reference the vectorised executor is tested against.
- :class:`VectorisedExecutor` (default): the clients' parameters stacked along a
  leading axis and trained together, in chunks that fit a memory budget.

Both derive every client's randomness from (run seed, round, client id), so they
agree to float tolerance. :mod:`hetfed.flower.executor` runs the same steps on
Flower SuperNodes, each holding its own client's state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, replace
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from hetfed.engine.client_store import ClientStore
from hetfed.engine.evaluate import ClientEvalData, Predictor, global_test
from hetfed.engine.rng import CLIENT_INIT, CLIENT_ROUND, derive_seeds, torch_gen
from hetfed.engine.sampling import global_scorers
from hetfed.engine.stacks import longest_first_blocks, stack_blocks
from hetfed.engine.types import (
    Broadcast,
    ClientBroadcast,
    ClientData,
    ClientState,
    Params,
    RoundUploads,
    Seen,
    Upload,
    concat_uploads,
    in_id_order,
    stack_states,
)
from hetfed.errors import RunError
from hetfed.interface import Algorithm, client_predictor
from hetfed.models.base import Model
from hetfed.processes import available_memory
from hetfed.run_spec import RunSpec
from hetfed.server.transport import RESIDUAL, Transport

if TYPE_CHECKING:
    from hetfed.config import TrainConfig
    from hetfed.engine.faults import Adversary, Colluding
    from hetfed.partition import Federation


@dataclass(frozen=True, eq=False)
class Pool:
    """The federation's train pool on the training device, and each client's indices."""

    x: torch.Tensor
    y: torch.Tensor
    train: tuple[np.ndarray, ...]
    seed: int
    val: tuple[np.ndarray, ...] = ()
    #: the federation's number of this pool's client 0: a Flower node with its own data numbers its clients
    #: from 0, and its clients' randomness and uploads must use the federation's numbers (else client 0 of
    #: every node would share batch orders, and a client-side lookup by id, CFL's cluster, would be wrong)
    first_id: int = 0


class RoundSkipped(RunError):
    """Fewer clients replied than the minimum: the round is not aggregated (the model stays)."""

    def __init__(self, rnd: int, got: int, need: int):
        self.round, self.got, self.need = rnd, got, need
        super().__init__(f"round {rnd}: {got} clients replied, fewer than flower.min_replies = {need}; round skipped")


class Executor(Protocol):
    """Where the clients live; see the module docstring."""

    name: str

    def start(self, run: RunSpec, fed: Federation, device: torch.device) -> None: ...
    def train(self, bc: Broadcast, clients: list[int]) -> Upload: ...
    def personalise(self, bc: Broadcast, clients: list[int],
                    on_chunk: Callable[[int, int], object] | None = None) -> dict[str, list[float]]: ...
    def evaluate(self, bc: Broadcast, clients: list[int], view: str | None = None) -> dict[str, list[Any]]: ...
    #: what the server holds of one client's update this round (an attack reads it): at once, or after the round
    def watch(self, bc: Broadcast, client: int) -> Seen | None: ...
    def watched(self) -> Seen | None: ...
    def stop(self) -> None: ...


def client_data(pool: Pool, chunk: list[int], round: int = 0, with_val: bool = False,
                rounds: list[int] | None = None, seeds: list[int] | None = None) -> ClientData:
    """A stack's training data, its clients named as the federation numbers them (``pool.first_id`` on); every
    client's seed comes from (run seed, round, client id) — each client's own round in ``rounds`` when given (an
    asynchronous server's clients, sent different model versions); ``seeds``: those seeds, already derived."""
    return ClientData(
        client_ids=[k + pool.first_id for k in chunk],
        x=pool.x,
        y=pool.y,
        indices=[pool.train[k] for k in chunk],
        seeds=seeds if seeds is not None else derive_seeds(seed_rows(pool, chunk, round, rounds)),
        val_indices=[pool.val[k] for k in chunk] if with_val else None,
    )


def seed_rows(pool: Pool, chunk: list[int], round: int = 0, rounds: list[int] | None = None) -> list[tuple[int, ...]]:
    """What each client's training seed of a round is derived from: (run seed, purpose, round, client id)."""
    per_client = rounds if rounds is not None else [round] * len(chunk)
    return [(pool.seed, CLIENT_ROUND, r, k + pool.first_id) for r, k in zip(per_client, chunk, strict=True)]


def initial_state(algo: Algorithm, client_id: int, seed: int) -> ClientState:
    """Client ``client_id``'s (the federation's number) initial local state, from its own generator."""
    return algo.client_init(client_id, torch_gen(seed, CLIENT_INIT, client_id))


def init_states(algo: Algorithm, n_clients: int, seed: int, block: int = 4096, first_id: int = 0,
                device: torch.device | str = "cpu") -> ClientStore:
    """Every client's initial local state, each from its own generator, stored compactly: on a GPU ``device``
    while the states fit :func:`state_budget_bytes`, else on the CPU."""
    store = ClientStore(n_clients, device, state_budget_bytes(device))
    for start in range(0, n_clients, block):
        ids = list(range(start, min(start + block, n_clients)))
        states = [initial_state(algo, k + first_id, seed) for k in ids]
        if states and states[0]:
            store.scatter(ids, stack_states(states))
    return store


#: the default working set of a chunk on a CPU: big enough to vectorise, small enough to stay in cache
CPU_BUDGET_MB = 128.0


#: the part of a GPU's free memory this process's defaults take: all of it, or 1/N in each of a ``--jobs N`` sweep's
#: workers, which share the device (six processes each sizing their stacks to a quarter of it ran out of memory,
#: results/gpu_h200_2026-11-30)
_GPU_SHARE = [1.0]


def share_gpu(processes: int) -> None:
    """This process is one of ``processes`` sharing its GPU (a sweep's worker): its default budgets are that part of
    one process's."""
    _GPU_SHARE[0] = 1.0 / max(1, processes)


def default_budget_mb(device: torch.device | str | None) -> float:
    """``train.memory_budget_mb`` when unset: 128 MB on a CPU, a quarter of the free memory of a GPU (of this
    process's share of it: :func:`share_gpu`)."""
    if device is not None and torch.device(device).type == "cuda" and torch.cuda.is_available():
        free, _total = torch.cuda.mem_get_info(torch.device(device))
        return max(CPU_BUDGET_MB, free / 4 / 2**20 * _GPU_SHARE[0])
    return CPU_BUDGET_MB


def state_budget_bytes(device: torch.device | str) -> int:
    """How much of a device the clients' stored states may take (:class:`~hetfed.engine.client_store.ClientStore`): on
    a GPU what a
    chunk's working set may (:func:`default_budget_mb`, a quarter of its free memory); none of a CPU (they are
    there already)."""
    return int(default_budget_mb(device) * 2**20) if torch.device(device).type == "cuda" else 0


def memory_chunk(model: Model, batch_size: int, memory_budget_mb: float) -> int:
    """How many clients' training fits the budget: params, grads, optimiser buffers, activations."""
    floats = 5 * model.n_params() + model.activation_floats(batch_size)
    return max(1, int(memory_budget_mb * 2**20 / (4 * floats)))


#: what one stacked training step costs beyond its clients' arithmetic (Python, autograd, kernel launches), in
#: seconds, and the arithmetic rate a client-step runs at, by device type; only the ratio matters (how many
#: client-steps one step's overhead is worth). The CPU value is benchmarks/unequal.py's best on this project's
#: 2-core machine (s/round at 2e-5 / 1e-4 / 4e-4 / 1.6e-3 / 6.4e-3: 1.07 / 0.83 / 0.65 / 0.62 / 0.89); the CUDA
#: one is a guess until a GPU measures it
STEP_OVERHEAD_S = {"cpu": 8e-4, "cuda": 1e-4}
FLOPS = {"cpu": 2e10, "cuda": 2e13}


def step_overhead(model: Model, batch_size: int, device: torch.device | str | None) -> float:
    """One stacked step's fixed cost in client-steps of this model: how much longer a stack may wait on its
    longest client before a second stack pays off (:func:`hetfed.engine.stacks.stack_blocks`)."""
    kind = torch.device(device).type if device is not None else "cpu"
    client_step = 6.0 * model.n_params() * batch_size / FLOPS.get(kind, FLOPS["cpu"])
    return STEP_OVERHEAD_S.get(kind, STEP_OVERHEAD_S["cpu"]) / max(client_step, 1e-12)


def eval_chunk(fed: Federation, ids: list[int], x: torch.Tensor, n_classes: int, max_floats: int) -> int:
    """How many clients to score at once: their longest own evaluation set × width within ``max_floats``.

    The global test set is not counted: the few clients that score it do so in blocks of
    their own (:func:`hetfed.engine.evaluate.client_scores`), so a chunk of 100 000 small clients
    is not cut into thousands because of a 10 000-image set most of them never see.
    """
    d = int(np.prod(x.shape[1:]))
    longest = max(max((len(fed.test[k]) for k in ids), default=1), max((len(fed.val[k]) for k in ids), default=1), 1)
    return max(1, max_floats // (longest * max(d, n_classes)))


class InProcessExecutor:
    """Clients' states in a dict in this process; steps run on stacks of ``chunk`` clients."""

    name = "in-process"

    def __init__(self, memory_budget_mb: float | None = None, chunk_clients: int | None = None,
                 eval_max_floats: int = 50_000_000, group_by_steps: bool = True):
        self.memory_budget_mb = memory_budget_mb
        self.chunk_clients = chunk_clients
        self.eval_max_floats = eval_max_floats
        #: stack clients of similar local steps together (False: in id order, one stack per memory chunk, as
        #: before #47; the benchmark compares the two)
        self.group_by_steps = group_by_steps
        self.states: ClientStore = ClientStore(0)
        self.adversary: Adversary | None = None
        #: the pool as the clients train on it under a data-poisoning attack (None: the pool itself)
        self.poisoned: tuple[torch.Tensor, torch.Tensor] | None = None

    def chunk_size(self, model: Model, batch_size: int) -> int:
        device = getattr(self, "device", None)
        if not model.stacks_clients(torch.device(device).type if device is not None else "cpu"):
            return 1  # its forward loops over a stack's clients on this device: stacking buys nothing
        if self.chunk_clients is not None:
            return self.chunk_clients
        budget = self.memory_budget_mb or default_budget_mb(device)
        return memory_chunk(model, batch_size, budget)

    def start(self, run: RunSpec, fed: Federation, device: torch.device) -> None:
        """Hold the run's clients on ``device``: the data pool, the global test set and every client's state."""
        algo, seed = run.algo, run.seed
        self.run, self.algo, self.fed, self.seed, self.device = run, algo, fed, seed, device
        x = torch.as_tensor(np.asarray(fed.x, dtype=np.float32), device=device)
        y = torch.as_tensor(np.asarray(fed.y, dtype=np.int64), device=device)
        self.x_global, self.y_global = global_test(fed, run.train, seed, device)
        self.pool = Pool(x, y, fed.train, seed, fed.val)
        self.transport: Transport = run.chain.transport
        #: send the transport's encodings rather than decoding them here (a Flower node with compression: what
        #: its records carry is what a real client would send); set by the node, never for an in-process run
        self.wire = False
        # error feedback's residuals join at the first round
        self.states = init_states(algo, fed.n_clients, seed, device=device)

    def _ensure_residuals(self, reference: Params) -> None:
        """With error feedback, every client holds a residual for each parameter the broadcast sends (zero until it
        first trains; a resumed store holds them already): client state, so every stack holds the same names."""
        if not self.transport.error_feedback or not self.fed.n_clients:
            return
        held = self.states.held_by_all()
        missing = {k: v for k, v in reference.items() if RESIDUAL + k not in held}
        if missing:  # (a Flower node loads some clients' states, residuals included, from its context)
            self.states.fill(self.transport.initial_residuals(missing))

    def number_from(self, first_id: int) -> None:
        """Name this executor's clients from ``first_id`` on, as the federation does (a Flower node with its own
        data learns its offset from the server's messages): their seeds, initial states and uploads follow."""
        if first_id != self.pool.first_id:
            self.pool = replace(self.pool, first_id=first_id)
            self.states = init_states(self.algo, self.fed.n_clients, self.seed, first_id=first_id, device=self.device)

    def _chunks(self, clients: list[int], size: int) -> Iterator[list[int]]:
        for start in range(0, len(clients), size):
            yield clients[start : start + size]

    def _stacks(self, clients: list[int], size: int) -> Iterator[list[int]]:
        """A round's clients in stacks of at most ``size`` (:meth:`blocks`), so that a client that finished its
        plan is not computed while a longer one goes on."""
        steps = [self.run.schedule.n_steps(len(self.pool.train[k])) for k in clients]
        for block in self.blocks(steps, size):
            yield [clients[i] for i in block]

    def blocks(self, steps: list[int], size: int) -> list[list[int]]:
        """Positions into ``steps`` (each client's planned local steps) in stacks of at most ``size``: longest first
        for a method of plain steps (``Capabilities.plain_steps``: its step computes only the clients still
        training, so one stack serves clients of any lengths), grouped by steps for the others (a stack computes
        every client, masked, until its longest is done), or in order (``group_by_steps`` off, or nothing to
        group)."""
        if size <= 1 or len(steps) <= 1 or not self.group_by_steps:
            return [list(range(start, min(start + size, len(steps)))) for start in range(0, len(steps), size)]
        if self.plain_steps():
            return longest_first_blocks(steps, size)  # a plain step computes only the clients still training
        return stack_blocks(steps, size, step_overhead(self.algo.model, self.run.schedule.batch_size, self.device))

    def plain_steps(self) -> bool:
        """Whether the run's steps compute only a stack's clients still training (``Capabilities.plain_steps`` or
        ``compact_steps``, a model without buffers)."""
        capabilities = self.algo.capabilities
        return (capabilities.plain_steps or capabilities.compact_steps) and not self.algo.model.buffer_names

    def _stacked(self, chunk: list[int], only: Container[str] | None = None) -> ClientState:
        """The stack's state as the algorithm sees it (the transport's residuals are not the algorithm's); ``only``:
        these names alone (None: all)."""
        return self.states.gather(chunk, self.device, keep=lambda name: not name.startswith(RESIDUAL)
                                  and (only is None or name in only))

    def _residuals(self, chunk: list[int]) -> ClientState:
        return self.states.gather(chunk, self.device, keep=lambda name: name.startswith(RESIDUAL))

    def _keep(self, chunk: list[int], new: ClientState, residual: ClientState | None = None) -> None:
        if self.transport.error_feedback:
            new = {**new, **(residual if residual is not None else self._residuals(chunk))}
        self.states.scatter(chunk, new)

    def train(self, bc: Broadcast, clients: list[int], reduce: bool = False) -> Upload:
        """Every chosen client's update, screened; chunks are folded into running sums, so memory does not
        grow with them (unless the screening or a robust rule needs the whole round). ``reduce``: return the
        sums even for one chunk (a Flower node's cohort: one combined upload)."""
        self._ensure_residuals(bc.params)
        adversary = self.attacker(bc.round)
        round_uploads = self.round_receiving(bc)
        poisoned = self.poisoned_pool(bc.round)
        for chunk in self._stacks(clients, self.chunk_size(self.algo.model, self.run.schedule.batch_size)):
            data = client_data(self.pool, chunk, bc.round)
            if poisoned is not None:
                data = replace(data, x=poisoned[0], y=poisoned[1])
            round_uploads.add(self._client_step(bc, chunk, data, adversary))
        return round_uploads.result(reduce)

    def round_receiving(self, bc: Broadcast) -> RoundUploads | Colluding:
        """Where round ``bc``'s uploads of this run go: its server's receiving side (screen, DP clip), through the
        colluding clients first when a colluding attack acts in the round."""
        # a node that sends what travels (encodings) leaves the screening to the server, which decodes first
        receiving = RoundUploads(None, stream=False) if self.wire else self.run.receiving(bc.params)
        adversary = self.attacker(bc.round)
        return receiving if adversary is None else adversary.receiving(receiving, bc)

    def attacker(self, rnd: int) -> Adversary | None:
        """The simulated attack when its malicious clients attack in round ``rnd`` (0-based), else None."""
        return self.adversary if self.adversary is not None and self.adversary.acts_in(rnd) else None

    def poisoned_pool(self, rnd: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The pool the clients train on in round ``rnd`` as a data-poisoning attack made it (None: the pool)."""
        return self.poisoned if self.attacker(rnd) is not None else None

    def _client_step(self, bc: Broadcast, chunk: list[int], data: ClientData, adversary: Adversary | None = None
                     ) -> Upload:
        """A stack's ``local_update``, a simulated attacker's change to its own upload, the upload's transport
        (compression; the residuals kept); the new states stored. What the stack sends, as the server reads it."""
        upload, new = self.algo.local_update(bc.for_clients(chunk, self.device), self._stacked(chunk), data)
        if adversary is not None:
            upload = adversary.poison(upload, bc)
        residual = self._residuals(chunk) if self.transport.error_feedback else {}
        if self.wire:  # a Flower node: the encoding itself leaves, the server decodes it
            upload, residual = self.transport.encode(upload, bc.params, residual, data.seeds)
        else:
            upload, residual = self.transport.send(upload, bc.params, residual, data.seeds,
                                                   still_read=tuple(new.values()))
        self._keep(chunk, new, residual)
        return upload

    def watch(self, bc: Broadcast, client: int) -> Seen | None:
        """What the server will hold of ``client``'s update for ``bc`` (an attack on one client reads it): here, what
        it sends as the server decodes it (its round's random streams, compression applied), computed now beside
        the round's own training, which it does not change (the client's stored state is left as it is). An
        executor that learns it only from the round's replies returns None and hands it over in :meth:`watched`."""
        self._ensure_residuals(bc.params)
        chunk = [client]
        data = client_data(self.pool, chunk, bc.round)
        upload, new = self.algo.local_update(bc.for_clients(chunk, self.device), self._stacked(chunk), data)
        residual = self._residuals(chunk) if self.transport.error_feedback else {}
        upload, _ = self.transport.send(upload, bc.params, residual, data.seeds, still_read=tuple(new.values()))
        return Seen(upload.params, [client])

    def watched(self) -> Seen | None:
        """Nothing: :meth:`watch` gave it at once."""
        return None

    def predictors(self, bc: Broadcast, clients: list[int], view: str | None = None
                   ) -> Iterator[tuple[list[int], Predictor]]:
        """What each of ``clients`` predicts with (``view``: one of the method's views), a stack at a time, fitted to
        their own rows where the method's clients fit it as they evaluate (:class:`~hetfed.interface.FitsToData`):
        what a membership attack on the clients' own models queries."""
        size = eval_chunk(self.fed, clients, self.pool.x, self.algo.model.n_classes, self.eval_max_floats)
        for chunk in self._chunks(clients, size):
            yield chunk, client_predictor(self.algo, bc.for_clients(chunk, self.device), self._stacked(chunk),
                                          len(chunk), partial(self._eval_data, chunk), view)

    def _eval_data(self, chunk: list[int], x_global: torch.Tensor | None = None,
                   y_global: torch.Tensor | None = None, scorers: list[bool] | None = None) -> ClientEvalData:
        """The clients ``chunk``'s rows as an evaluation reads them (their test, validation and training indices
        into the pool) and the global test set (this executor's, or ``x_global``/``y_global``)."""
        return ClientEvalData([k + self.pool.first_id for k in chunk], self.pool.x, self.pool.y,
                              [self.fed.test[k] for k in chunk], [self.fed.val[k] for k in chunk],
                              self.x_global if x_global is None else x_global,
                              self.y_global if y_global is None else y_global, self.fed.n_classes, scorers,
                              [self.fed.train[k] for k in chunk])

    def train_rows(self, bc: ClientBroadcast, clients: list[int], rounds: list[int]) -> Upload:
        """Each client's update from its own broadcast row (``bc.params[j]`` for ``clients[j]``) with the random
        streams of its own round (``rounds[j]``), every client's row kept and none screened (the caller screens
        each client against the model it was sent): an asynchronous server's clients of several model versions in
        one stack. The algorithm must read the broadcast only as ``bc.stacked(n)`` (``Capabilities.stacks_runs``)."""
        position = {k: j for j, k in enumerate(clients)}
        self._ensure_residuals({k: v[0] for k, v in bc.params.items()})  # one client's shapes
        uploads = []
        for chunk in self._stacks(clients, self.chunk_size(self.algo.model, self.run.schedule.batch_size)):
            at = [position[k] for k in chunk]
            data = client_data(self.pool, chunk, rounds=[rounds[j] for j in at])
            uploads.append(self._client_step(bc.rows(at), chunk, data))
        return in_id_order(concat_uploads(uploads))

    def set_adversary(self, adversary: Adversary) -> None:
        """Simulate malicious clients (:class:`hetfed.engine.faults.Adversary`) from now on."""
        self.adversary = adversary
        poisoned = adversary.training_data(self.pool.x, self.pool.y, self.pool.train) if adversary.active else None
        self.poisoned = None if poisoned is None or poisoned[1] is self.pool.y else poisoned

    def personalise(self, bc: Broadcast, clients: list[int],
                    on_chunk: Callable[[int, int], object] | None = None) -> dict[str, list[float]]:
        info: dict[str, list[float]] = {}
        plan = self.algo.personal_plan(self.fed, self.seed)
        model, batch = plan.model, plan.batch_size
        done = 0
        for chunk in self._chunks(clients, self.chunk_size(model, batch)):
            new, extra = self.algo.personalise(bc.for_clients(chunk, self.device), self._stacked(chunk),
                                               client_data(self.pool, chunk, bc.round, True))
            self._keep(chunk, new)
            for key, values in extra.items():
                info.setdefault(key, []).extend(float(v) for v in values)
            done += len(chunk)
            if on_chunk:
                on_chunk(done, len(clients))
        return info

    def evaluate(self, bc: Broadcast, clients: list[int], view: str | None = None,
                 among: list[int] | None = None,
                 global_set: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, list[Any]]:
        """``among``: every client of this evaluation when ``clients`` are some of them (a Flower node's
        cohort), so the same clients score the global test set however the clients are spread. ``global_set``:
        ``(x, y)`` scored by every client's own model in place of the global test set (a backdoor's stamped
        samples), each client evaluating as it does at every evaluation — the method's own ``evaluate_client``
        (IFCA's cluster chosen by validation loss, pFedFDA's adaptation, a view's predictor)."""
        reports: dict[str, list[Any]] = {}
        size = eval_chunk(self.fed, clients, self.pool.x, self.algo.model.n_classes,
                          self.eval_max_floats)
        first = self.pool.first_id
        named = among or [k + first for k in clients]
        x_global, y_global = global_set or (self.x_global, self.y_global)
        for chunk in self._chunks(clients, size):
            ids = [k + first for k in chunk]
            scorers = None if view or global_set else global_scorers(self.run.train, ids, self.seed, among=named)
            data = self._eval_data(chunk, x_global, y_global, scorers)
            for key, values in self.algo.evaluate_client(bc.for_clients(chunk, self.device), self._stacked(chunk), data,
                                                         view).items():
                reports.setdefault(key, []).extend(values)
        return reports

    def stop(self) -> None:
        return None


class SequentialExecutor(InProcessExecutor):
    """One client at a time: the reference the vectorised executor is tested against."""

    name = "sequential"

    def __init__(self, memory_budget_mb: float | None = None, chunk_clients: int | None = None, **kw: Any) -> None:
        super().__init__(memory_budget_mb, 1, **kw)


class VectorisedExecutor(InProcessExecutor):
    """All chosen clients at once, chunked to ``memory_budget_mb`` (or ``chunk_clients``)."""

    name = "vectorised"


def estimate_memory(run: RunSpec, fed: Federation, eval_max_floats: int = 50_000_000) -> dict[str, int]:
    """What an in-process run will hold at its peak, in bytes, by part (a conservative estimate).

    ``pool``: the train pool (shared by every client, never copied); ``client_states``:
    every client's local state (CGAU rows, kept optimiser state) in the store;
    ``working_set``: one chunk of clients training (the memory budget) plus the
    round's running sums; ``round_updates``: every update of a round when a robust
    rule or the algorithm needs them all, else the norm filter's reference clients
    (the rest stream); ``evaluation``:
    one chunk of clients scoring.
    """
    algo, train = run.algo, run.train
    one = algo.client_init(0, torch_gen(0, CLIENT_INIT, 0))
    per_client = sum(v.numel() * v.element_size() for v in one.values())
    shared = sum(int(np.prod(s.shape)) for s in algo.model.specs() if not s.local)
    budget = _budget(train)
    training = 4 * (5 * algo.model.n_params() + algo.model.activation_floats(run.schedule.batch_size))
    per_round = run.per_round
    return {
        "pool": int(np.asarray(fed.x).nbytes + np.asarray(fed.y).nbytes),
        "client_states": per_client * fed.n_clients,
        "working_set": min(int(budget * 2**20), per_round * training) + 16 * shared,
        "round_updates": 4 * shared * (per_round if run.holds_round()
                                       else run.chain.held_for_screen(per_round, algo.capabilities.asynchronous)),
        "evaluation": 4 * eval_max_floats,
    }


def _budget(train: TrainConfig) -> float:
    return train.memory_budget_mb or default_budget_mb(train.device if train.device != "auto" else None)


def check_memory(run: RunSpec, fed: Federation, available: int | None = None) -> dict[str, int]:
    """Refuse up front a run whose estimate exceeds the memory available, saying why and what to change."""
    parts = estimate_memory(run, fed)
    total = sum(parts.values())
    available = available_memory() if available is None else available
    if available is not None and total > available:
        gb = 2**30
        detail = ", ".join(f"{k.replace('_', ' ')} {v / gb:.2f}" for k, v in parts.items())
        raise RunError(
            f"this run needs about {total / gb:.1f} GB ({detail} GB) but {available / gb:.1f} GB are available; "
            f"expected fewer clients (partition.clients = {fed.n_clients}), a smaller model, or a smaller "
            f"train.memory_budget_mb (now {_budget(run.train):g})"
            + (", or server.combine.rule: mean (the round's updates then stream)" if run.holds_round() else "")
        )
    return parts


def n_chunks(n: int, size: int) -> int:
    return math.ceil(n / max(size, 1))
