"""Runs trained as one stack: the runs of a sweep (seeds, grid points) step through their rounds together, in one
thread, and each round's client steps of every run are computed as one stack of clients.

Each run keeps everything that is its own — its algorithm, server state, client store, random streams (its clients'
seeds come from its own run seed), screening, aggregation, evaluation, run directory, checkpoints and resume — because
each run is an ordinary run of the driver (:func:`hetfed.runs.runner.run_experiment`) on its own thread. Only its round
loop differs: the loop is written as steps that ask their executor for the clients' work
(:func:`hetfed.executors.updates.drive`), and :meth:`StackedRunExecutor.drive_rounds` hands a run's rounds to the
:class:`Rendezvous` instead of answering them one by one. When every run still training has handed its rounds over, the
sweep's thread runs them in lockstep (:meth:`Rendezvous.lockstep`): each run's round goes as far as its next request,
and the requests of all runs are answered together — those whose client step is the same computation
(:func:`~hetfed.executors.stacked_work.step_key`: the algorithm, its parameters, schedule, optimiser, model and learning
rate) as one stack of clients, each client with its own run's broadcast parameters (a :class:`ClientBroadcast`), its own
data and its own seed; each run's part of the stack's uploads goes through the run's own transport (compression, its
clients' error-feedback residuals) before its screening, as its executor does alone. A client's numbers do not depend on
its stack, so a stacked sweep gives the numbers of its runs one by one (tested on a CPU: runs.csv to the bit, every
value of metrics.csv to float tolerance — a joined stack pads its batches and evaluation blocks to other widths, and
its per-round losses have differed in the 7th–9th digit).

Evaluations meet the same way (:func:`~hetfed.executors.stacked_work.evaluate_together`): the runs' clients score their
models in one stack, each client on its own run's validation, test and global test sets (the runs' pools and global sets
joined), and each run gets its clients' reports as if it had evaluated alone. So does the server's part of a round along
the run axis: the servers' updates of a method that computes them along it in one call
(:class:`~hetfed.interface.AggregatesRuns`: FedGen's, Fed-FSNet's, FedDF's, pFedHN's and pFedLA's, and the server
chain's of every method whose server is the chain alone, :meth:`~hetfed.server.chain.Chain.step_runs`), the runs'
screens' verdicts on a block (:meth:`~hetfed.server.screen.Screen.verdicts`), the runs' servers' models in one forward
(:meth:`Rendezvous.score_together`), their evaluations summarised as arrays (:func:`hetfed.engine.summary.summaries`),
and a block's updates measured for every run's screen in one pass (:func:`hetfed.executors.stacked_work._measured`) —
each run's numbers as alone. The joined computations are :mod:`hetfed.executors.stacked_work`'s; this module holds the
runs and their lockstep.

Only algorithms that declare ``Capabilities.stacks_runs`` (their client step and evaluation read the broadcast only
through ``bc.stacked(n)``, ``bc.extra_rows``, their clients' personal rows, names, ``Proximal`` centres, ``bc.lr`` and
the numbers among the extras) are stacked across runs (:func:`~hetfed.executors.stacked_work.joins`): a joined stack's
broadcast holds each client's own run's model, extras and personal rows; runs join when the numbers among their
extras are equal. The others step and evaluate alone, through the in-process executor's
own round, so they give the numbers of the run without ``--stack``. Personalisation is each run's own, one run at a time
(asynchronous methods are refused).

Every round of every run — its server work and its clients' — runs on one thread, the sweep's own, on its torch threads
(:meth:`Rendezvous.serve` says why); each run's thread does the rest of its run (loading, its rows and summary) on one
torch thread.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import torch

from hetfed.engine.summary import summaries
from hetfed.engine.types import Broadcast
from hetfed.executors.inprocess import Executor, InProcessExecutor
from hetfed.executors.stacked_work import (
    Joined,
    evaluate_together,
    evaluation_key,
    joins,
    step_key,
    train_together,
)
from hetfed.executors.updates import (
    Aggregate,
    Evaluate,
    ReadBack,
    Request,
    ScoreServer,
    Steps,
    Summarise,
    Train,
    read_back,
)
from hetfed.interface import (
    aggregate_key,
    aggregate_runs,
    aggregates_runs,
    evaluate_servers,
    scores_servers_together,
)


@dataclass(eq=False, kw_only=True)
class _Answered:
    """Work a run hands to :meth:`Rendezvous.serve`: set ``result`` or ``error``, then ``done``."""

    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None

    def answer(self) -> Any:
        """The result, once ``done`` (the error raised in the run that asked)."""
        if self.error is not None:
            raise self.error
        return self.result


@dataclass(eq=False)
class _Rounds(_Answered):
    """A run's rounds handed to the sweep's thread (:meth:`StackedRunExecutor.drive_rounds`): ``steps(r)`` is round
    ``r`` as steps, for each round of ``rounds`` until one ends the run; ``asked`` is what its round in progress
    (``current``) asks now."""

    executor: StackedRunExecutor
    steps: Callable[[int], Steps[bool]]
    rounds: Iterator[int]
    current: Steps[bool] | None = None
    asked: Request | None = None

    # what the joined computations read of a request
    @property
    def bc(self) -> Broadcast:
        assert isinstance(self.asked, Train | Evaluate)
        return self.asked.bc

    @property
    def clients(self) -> list[int]:
        assert isinstance(self.asked, Train | Evaluate)
        return self.asked.clients

    @property
    def view(self) -> str | None:
        return self.asked.view if isinstance(self.asked, Evaluate) else None

    @property
    def joined(self) -> Joined:
        return self.executor.rendezvous.joined

    def advance(self, answer: Any = None) -> None:
        """On to the run's next request: its round in progress sent ``answer``, or its next round started; done
        when a round ends the run or none is left. An error of the run's own ends it (its thread raises it)."""
        try:
            while True:
                try:
                    if self.current is None:
                        r = next(self.rounds, None)
                        if r is None:
                            break
                        self.current = self.steps(r)
                        self.asked = next(self.current)
                    else:
                        self.asked = self.current.send(answer)
                    return
                except StopIteration as end:
                    self.current, answer = None, None
                    if end.value:
                        break
        except Exception as err:  # handed back to the run it belongs to (Ctrl-C stops every run: the lockstep's)
            self.error = err
        self.fail(None)

    def fail(self, error: BaseException | None) -> None:
        """The run's rounds are over (``error``: a joined computation it was part of failed)."""
        if error is not None:
            self.error = error
        self.current = self.asked = None
        self.done.set()


T = TypeVar("T")


def _set_threads(n: int) -> None:
    """This thread computes on ``n`` torch threads. Why the first call: torch gives a thread its number lazily, at
    its first parallel operation, from the process's last ``set_num_threads`` — which another thread may have
    changed since — unless the thread has asked for it once before."""
    torch.get_num_threads()
    torch.set_num_threads(n)


@dataclass(eq=False)
class _Call(_Answered):
    """A run's own work handed to the sweep's thread (:meth:`Rendezvous.call`)."""

    fn: Callable[[], Any]

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as err:  # noqa: BLE001  (handed back to the run that asked)
            self.error = err
        finally:
            self.done.set()


class Rendezvous:
    """Where the runs of a stacked sweep meet; see the module docstring.

    ``members`` runs take part; each calls :meth:`leave` when it is done (finished or failed), so the others
    never wait for it. The run whose rounds complete the set (:meth:`hand_over`) hands them all to :meth:`serve`,
    which runs them in lockstep.
    """

    def __init__(self, members: int, on_round: Callable[[int, int], object] | None = None,
                 on_ready: Callable[[int, int], object] | None = None) -> None:
        #: told (round trained, rounds of the longest run) after each joined round (a sweep's progress)
        self.on_round = on_round
        #: told (runs ready, runs taking part) when a run hands its rounds over before the others have (a sweep's
        #: progress while its runs prepare: Fashion-MNIST's Γ takes ~30 s a run, and the runs take turns)
        self.on_ready = on_ready
        #: held by the one run that is doing its own work (loading, rows, summary): the runs take turns
        #: instead of contending for the cores and torch's thread pool (measured: 20 runs at once on 2 cores were
        #: 1.6× slower than one by one; on a 16-core H200 host, 4 runs at once gave the same sweep time as turns,
        #: 7.66 vs 7.58 s for 20 seeds); a run lets go of it while its rounds are run
        self.turn = threading.Lock()
        self._lock = threading.Lock()
        self._members = members
        self._waiting: list[_Rounds] = []
        #: what the joined client steps and evaluations keep between rounds (the runs' joined pools and sets)
        self.joined = Joined()
        #: the global test sets of the runs whose servers were last scored together, stacked (:meth:`score_together`)
        self.server_sets: dict[tuple[int, ...], tuple[torch.Tensor, tuple[torch.Tensor, ...]]] = {}
        #: the torch threads of the thread that made this meeting point, which computes for the runs (:meth:`serve`)
        self.threads = torch.get_num_threads()
        #: what :meth:`serve` computes, in order: the runs' rounds, or a call (``None``: every run has left)
        self._work: queue.SimpleQueue[list[_Rounds] | _Call | None] = queue.SimpleQueue()
        #: how many runs' executors have joined: each one's place, which orders every batch (:meth:`lockstep`)
        self.places = itertools.count()

    def serve(self) -> None:
        """Run the runs' rounds in lockstep and every :meth:`call` of theirs, until the last one leaves — on the
        thread that made this meeting point (the sweep's), with its torch threads, while the runs' own threads
        compute on one each (:meth:`join`).

        Why one thread, and that one: torch's CPU thread pool is OpenMP's, which belongs to the thread that calls
        it. Runs that each computed on a pool of their own left it spinning on the cores the next run's pool
        needed (5 default runs × 30 rounds on 2 cores: 20.2 s stacked on 2 threads, 13.4 s on one, 14.7 s one by
        one); and once a thread's pool has worked, another thread's pool runs several times slower beside it
        (a stacked sweep after a sweep one by one in the same process: 5.3 s instead of 2.6 s, 60 rounds) — so the
        thread whose pool the process already has does the work."""
        try:
            if self._members <= 0:
                return
            while (work := self._work.get()) is not None:
                if isinstance(work, _Call):
                    work.run()
                else:
                    self.lockstep(work)
        finally:
            torch.set_num_threads(self.threads)  # the process's number again, for threads started later

    def hand_over(self, rounds: _Rounds) -> None:
        """A run's rounds, run in lockstep with the others' (:meth:`lockstep`) once every run still training has
        handed its own over; returns when they are done (raises the run's error)."""
        with self._lock:
            self._waiting.append(rounds)
            ready, members = len(self._waiting), self._members
            batch = self._ready()
        if batch:
            self._work.put(batch)
        elif self.on_ready is not None:
            self.on_ready(ready, members)
        self.turn.release()
        try:
            rounds.done.wait()
        finally:
            self.turn.acquire()
        rounds.answer()

    def call(self, fn: Callable[[], T]) -> T:
        """``fn()`` computed by :meth:`serve` (a run's own heavy tensor work: its personal phase), its result or
        error returned here; the caller keeps its turn."""
        work = _Call(fn)
        self._work.put(work)
        work.done.wait()
        return cast(T, work.answer())

    def join(self) -> None:
        """A run starts its own work (call from its thread, before anything else): on one torch thread."""
        _set_threads(1)
        self.turn.acquire()

    def leave(self) -> None:
        """A run is done (finished or failed; called from its thread, which holds its turn). The last one ends
        :meth:`serve`."""
        with self._lock:
            self._members -= 1
            batch = self._ready()
            last = self._members == 0
        if batch:
            self._work.put(batch)
        if last:
            self._work.put(None)
        self.turn.release()

    def _ready(self) -> list[_Rounds]:
        if self._waiting and len(self._waiting) >= self._members:
            batch, self._waiting = self._waiting, []
            return batch
        return []

    def lockstep(self, batch: list[_Rounds]) -> None:
        """The runs' rounds, each run's next request answered together with the others' (:func:`train_together`,
        :func:`evaluate_together`, or the run's own executor where it does not join), until every run is done."""
        # in the runs' places, not in the order their threads arrived: the same set of runs gives the same joined
        # pools, kept between rounds (in arrival order, the pools were joined again almost every round)
        running = sorted(batch, key=lambda r: r.executor.place)
        try:
            for run in running:
                run.advance()
            while running := [r for r in running if not r.done.is_set()]:
                trained = [r for r in running if isinstance(r.asked, Train)]
                reached = max((r.bc.round + 1 for r in trained), default=0)
                longest = max((r.executor.run.train.rounds for r in trained), default=0)
                # each kind in turn: a run answered here may ask the next kind at once (trained, then evaluated)
                for kind, together, key_of in ((Train, train_together, _train_key),
                                               (Aggregate, _aggregate_together, _aggregate_key),
                                               (ReadBack, _read_back_together, _read_back_key),
                                               (Evaluate, evaluate_together, _evaluation_key),
                                               (ScoreServer, self.score_together, _score_key),
                                               (Summarise, _summarise_together, _summary_key)):
                    self._answer([r for r in running if isinstance(r.asked, kind)], together, key_of)
                    # told once the round's steps are trained, before a run answered later can end (and its thread
                    # report it done: its sweep's line then gave the ETA of a round it had already trained)
                    if kind is Train and self.on_round is not None and trained:
                        self.on_round(reached, longest)
        except BaseException as err:  # whatever failed, no run waits forever: each unfinished one fails with it
            for run in running:
                if not run.done.is_set():
                    run.fail(err)

    def score_together(self, group: Sequence[_Rounds]) -> list[dict[str, float]]:
        """Every request's server model (the same method and model) scored on its run's global test set, in one
        stacked forward (:func:`hetfed.interface.evaluate_servers`)."""
        asked = [cast(ScoreServer, r.asked) for r in group]
        xs = tuple(a.x for a in asked)
        key = tuple(id(x) for x in xs)
        kept = self.server_sets.get(key)
        if kept is None or any(a is not b for a, b in zip(kept[1], xs, strict=True)):
            kept = (torch.stack(xs), xs)
            self.server_sets = {key: kept}  # the sets of one group of runs at a time
        return evaluate_servers([a.algo for a in asked], [a.server for a in asked], kept[0], [a.y for a in asked])

    @staticmethod
    def _answer(asking: list[_Rounds], together: Callable[[list[_Rounds]], list[Any]],
                key_of: Callable[[_Rounds], Any]) -> None:
        """The requests of one kind: those that may share a computation in groups of equal keys (``key_of``), the
        others (key None) alone."""
        groups: dict[Any, list[_Rounds]] = {}
        for run in asking:
            key = key_of(run)
            groups.setdefault(("alone", run.executor.place) if key is None else key, []).append(run)
        for key, group in groups.items():
            try:
                answers = [_alone(group[0])] if key[0] == "alone" else together(group)
            except Exception as err:  # every run of the group fails with it (Ctrl-C: every run, the lockstep's)
                for run in group:
                    run.fail(err)
                continue
            for run, answer in zip(group, answers, strict=True):
                run.advance(answer)


def _train_key(run: _Rounds) -> Any:
    return step_key(run.executor, run.bc) if joins(run.executor, run.bc) else None


def _evaluation_key(run: _Rounds) -> Any:
    """Evaluations scored in one stack (None: alone — a backdoor's stamped set scored in place of the global test
    set, which a joined evaluation does not take)."""
    asked = cast(Evaluate, run.asked)
    return (evaluation_key(run.executor, run.bc, run.view)
            if run.clients and asked.global_set is None and joins(run.executor, run.bc) else None)


def _score_key(run: _Rounds) -> Any:
    """Servers' models scored in one forward: the same network, whatever method trained it, scored the base way, on
    this device, global test sets of one shape (each run scores its own)."""
    asked = cast(ScoreServer, run.asked)
    if not scores_servers_together(asked.algo):
        return None
    return ("score", run.executor.run.network_identity(), str(asked.x.device), tuple(asked.x.shape), asked.x.dtype)


def _aggregate_key(run: _Rounds) -> Any:
    """Servers updated in one call, of equal :func:`~hetfed.interface.aggregate_key`: runs of one method, with the
    same parameters and model, where the method aggregates its own way; runs of one network, whatever their methods,
    where the server is the server chain alone (FedAvg's and FedProx's runs of one chain step it together)."""
    asked = cast(Aggregate, run.asked)
    key = aggregate_key(asked.algo, asked.server, asked.upload)
    if key is None:
        return None
    spec = run.executor.run
    return "aggregate", spec.model_identity() if aggregates_runs(asked.algo) else spec.network_identity(), key


def _aggregate_together(group: Sequence[_Rounds]) -> list[Any]:
    asked = [cast(Aggregate, r.asked) for r in group]
    return aggregate_runs([a.algo for a in asked], [a.server for a in asked], [a.upload for a in asked])


def _summary_key(run: _Rounds) -> Any:
    """Every evaluation summarised in one call: :func:`~hetfed.engine.summary.summaries` groups them by shape."""
    return ("summary",)


def _summarise_together(group: Sequence[_Rounds]) -> list[Any]:
    return summaries([cast(Summarise, r.asked).reports for r in group])


def _read_back_key(run: _Rounds) -> Any:
    """Rounds' training losses and finite checks read back at once: the runs' tensors on one device."""
    return ("read back", str(run.executor.device))


def _read_back_together(group: Sequence[_Rounds]) -> list[Any]:
    return read_back([cast(ReadBack, r.asked) for r in group])


def _alone(run: _Rounds) -> Any:
    """A request of a run that shares no stack, answered by the in-process executor's own round or evaluation (the
    run's executor seen as its base class: its own ``train``/``evaluate`` would hand the work back to this thread)."""
    assert run.asked is not None
    return run.asked.answer(cast(Executor, super(StackedRunExecutor, run.executor)))


class StackedRunExecutor(InProcessExecutor):
    """One run's client steps in a stacked sweep: its rounds and evaluations go to the :class:`Rendezvous`; its
    personalisation is its own (:class:`~hetfed.executors.inprocess.InProcessExecutor`'s), computed by
    :meth:`Rendezvous.serve`."""

    name = "stacked"

    def __init__(self, rendezvous: Rendezvous, memory_budget_mb: float | None = None,
                 chunk_clients: int | None = None) -> None:
        super().__init__(memory_budget_mb, chunk_clients)
        self.rendezvous = rendezvous
        self.place = next(rendezvous.places)

    def drive_rounds(self, steps: Callable[[int], Steps[bool]], rounds: range) -> None:
        """The run's rounds, in lockstep with the other runs' on the sweep's thread (:meth:`Rendezvous.lockstep`)."""
        self.rendezvous.hand_over(_Rounds(self, steps, iter(rounds)))

    def evaluate(self, bc: Broadcast, clients: list[int], view: str | None = None,
                 among: list[int] | None = None,
                 global_set: tuple[torch.Tensor, torch.Tensor] | None = None) -> dict[str, list[Any]]:
        """An evaluation outside the lockstep (a personalised view's): this run's own, on the sweep's thread."""
        return self.rendezvous.call(lambda: super(StackedRunExecutor, self).evaluate(bc, clients, view, among,
                                                                                     global_set))

    def personalise(self, bc: Broadcast, clients: list[int],
                    on_chunk: Callable[[int, int], object] | None = None) -> dict[str, list[float]]:
        """The run's personal phase, alone, computed by :meth:`Rendezvous.serve` (on the sweep's thread and its
        torch threads, like every client step of the sweep)."""
        return self.rendezvous.call(lambda: super(StackedRunExecutor, self).personalise(bc, clients, on_chunk))


