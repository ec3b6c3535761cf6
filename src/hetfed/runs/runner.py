"""``hetfed run``: every configured method on the same federation, one run directory — the run driver.

Four named steps: **plan** (the config resolved into the methods to train, each with its effective settings,
its algorithm and its executor — built, and so validated, before any file), **run directory** (created, or a
failed one reopened to resume; :mod:`hetfed.runs.rundir` owns its layout), **execute** (each executor kind
opened as a context manager — :mod:`hetfed.executors.kinds`; the driver names none — and its methods trained in
its session, watched by round observers: :mod:`hetfed.runs.observers`) and **summarise** (``summary.json``
written last, status "complete"). A failure at any point marks the directory "failed" with the reason —
Ctrl-C included — and keeps what was finished.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from rich.console import Console

from hetfed.config import Config, dump_config, load_run_config
from hetfed.console import LogProgress, make_console, print_loading, round_progress
from hetfed.engine.host_memory import keep_freed_memory
from hetfed.engine.types import ServerState
from hetfed.errors import RunError, interruption_reason
from hetfed.executors.inprocess import Executor
from hetfed.executors.kinds import ClientSteps, ExecutorKind, Opening
from hetfed.executors.simulate import personalise, resolve_device, simulate
from hetfed.executors.updates import SimulationResult
from hetfed.interface import Algorithm, reported, served
from hetfed.pipeline import Prepared, prepare
from hetfed.processes import last_words, once
from hetfed.runs.checkpoint import Checkpointer, check_streams, read_checkpoint, remove_checkpoints
from hetfed.runs.leakage import Found, InversionObserver, membership, reads
from hetfed.runs.observers import (
    CheckpointObserver,
    MetricsObserver,
    ProgressObserver,
    write_evaluation,
)
from hetfed.runs.plan import MethodPlan, check_config, check_devices, plan
from hetfed.runs.rundir import (
    CHECKPOINTS,
    CONFIG,
    EXECUTOR_LOG,
    FEDERATION,
    LEAKAGE,
    METRICS,
    SUMMARY,
    Heartbeat,
    MetricsWriter,
    check_out,
    new_run_dir,
    run_state,
    set_status,
    write_json_atomic,
)
from hetfed.runs.summary import method_summary, print_summary, row_name, run_summary, view_row
from hetfed.runs.tracking import Trackers, check_trackers, open_trackers
from hetfed.server.transport import transport

if TYPE_CHECKING:
    pass


@dataclass(frozen=True, eq=False)
class RunOutput:
    run_dir: Path
    summary: dict[str, Any]


@dataclass
class Recording:
    """The run directory while the run lives: its metrics file, heartbeat and checkpoints, the finished
    methods' rows, and (resuming) the checkpoint of the method that was in progress."""

    run_dir: Path
    writer: MetricsWriter
    heartbeat: Heartbeat
    checkpointer: Checkpointer
    methods: dict[str, dict[str, Any]]
    current: dict[str, Any] | None
    started: str


@dataclass(frozen=True, eq=False)
class Execution:
    """What every method of a run shares while it trains."""

    config: Config
    fed: Any
    recording: Recording
    bar: Any


def run_experiment(
    config: Config,
    out: str | Path | None = None,
    progress: bool = True,
    console: Console | None = None,
    prepared: Prepared | None = None,
    executor: ExecutorKind | None = None,
    present: Callable[[Path, Console | None], None] | None = None,
    resume: bool = False,
    tracking_root: Path | None = None,
    tracking_tags: dict[str, str] | None = None,
    display: LogProgress | None = None,
) -> RunOutput:
    """Run all methods of ``config``; returns the run directory and its summary.

    ``resume``: ``out`` is a failed or killed run of this ``config``; continue it from its checkpoint (see
    :mod:`hetfed.runs.checkpoint`), or from the start when it has none yet. What it finished is not redone and
    metrics.csv gets no row twice. ``executor``: every method's clients compute there, whatever
    ``train.executor`` says (a Flower ServerApp passes its deployment). ``present(run_dir, status)``: draw the
    run's figures and ``report.html`` at the end (a sweep presents all its runs at once instead).
    ``tracking_root`` / ``tracking_tags``: where MLflow's default store lives and extra tags (a sweep passes its
    directory and point; see :mod:`hetfed.runs.tracking`). ``display``: where the rounds' progress goes instead
    of this run's own bar (a sweep's lines, its runs otherwise quiet).
    """
    console = console or make_console()
    status = make_console(stderr=True) if progress else None
    warn = status or make_console(stderr=True)
    t_start = time.perf_counter()
    _check_before_loading(config)
    ckpt = None
    if resume:
        ckpt = _checkpoint_to_resume(Path(out), warn, config)  # type: ignore[arg-type]  # a resume names its directory
    else:
        check_out(out)  # what needs no data is checked before loading it (minutes on embedded data)
    prep = prepared or prepare(config, progress=progress, status=status)
    if status is not None:  # quiet (a sweep's runs too: it prints each line once): in summary.json only
        print_loading(status, prep.notes, prep.warnings)
    plans = plan(config, prep.federation, ckpt, executor)
    rec = open_run_directory(config, out, ckpt if resume else None, resume)
    trackers: Trackers | None = None
    mark_failed = once(lambda err: _mark_failed(rec, trackers, err))  # by a signal's handler first, maybe
    try:
        trackers = _start_recording(config, prep, rec, resume, warn, tracking_root, tracking_tags)
        if ckpt is None:
            torch.manual_seed(config.seed)  # nothing should use the global generator; belt and braces
        # a process stopped at once (a second signal during a Flower simulation) marks the run failed first
        with display or round_progress(progress, console) as bar, last_words(mark_failed):
            execute(Execution(config, prep.federation, rec, bar), plans, status)
        summary = summarise(config, prep, rec, t_start)
    except BaseException as err:
        mark_failed(err)
        raise
    if present is not None:
        present(rec.run_dir, status)
    if trackers is not None:  # after the figures and report.html, which it sends along
        trackers.finish(rec.run_dir, summary, "complete")
    if progress:
        print_summary(summary, rec.run_dir, console)
    return RunOutput(rec.run_dir, summary)


def _check_before_loading(config: Config) -> None:
    """What is refused before any data is loaded or any file written: a tracker that is not installed, the
    components' settings against each other, ``cuda`` without a GPU, a value of ``HETFED_MALLOC`` (whose allocator
    setting is made here, once a process)."""
    keep_freed_memory()
    check_trackers(config.tracking)
    check_config(config)
    check_devices(config)


def _checkpoint_to_resume(out: Path, warn: Console, config: Config) -> dict[str, Any] | None:
    """The checkpoint a resume continues from (None: the run had none yet); a refused resume marks the run
    failed, saying why, before anything is loaded."""
    try:
        ckpt = read_checkpoint(out, warn=lambda message: warn.print(message, style="yellow", soft_wrap=True))
        if ckpt is not None:
            check_streams(ckpt, [transport(config.method_server(m).compression) for m in config.methods])
        return ckpt
    except RunError as err:  # refused: the run is not running any more, and says why
        set_status(out, "failed", reason=f"resume refused: {err}")
        raise


def open_run_directory(config: Config, out: str | Path | None, ckpt: dict[str, Any] | None, resume: bool) -> Recording:
    """A new run directory with its config.yaml, or the failed run being resumed (its metrics.csv cut back to
    what the checkpoint had written); the heartbeat started."""
    if resume:
        run_dir = Path(out)  # type: ignore[arg-type]  # a resume always names its directory
        writer = MetricsWriter(run_dir / METRICS, keep_bytes=ckpt["metrics_offset"] if ckpt else None)
        started = ckpt["started"] if ckpt else time.strftime("%Y-%m-%dT%H:%M:%S")
        if ckpt is not None and "torch_rng" in ckpt:
            torch.set_rng_state(ckpt["torch_rng"])
    else:
        run_dir = new_run_dir(out, config.out_dir, config.name)
        (run_dir / CONFIG).write_text(dump_config(config))
        started = time.strftime("%Y-%m-%dT%H:%M:%S")
        writer = MetricsWriter(run_dir / METRICS)
    heartbeat = Heartbeat(run_dir)
    heartbeat.start()  # refreshed from a timer while the run lives, however long a round or an evaluation takes
    methods: dict[str, dict[str, Any]] = dict(ckpt["methods"]) if ckpt else {}
    checkpointer = Checkpointer(run_dir, writer, methods, started, resumes=ckpt["resumes"] + 1 if ckpt else int(resume))
    checkpointer.done = list(ckpt["done"]) if ckpt else []
    return Recording(run_dir, writer, heartbeat, checkpointer, methods, ckpt.get("current") if ckpt else None,
                     started)


def _start_recording(config: Config, prep: Prepared, rec: Recording, resume: bool, warn: Console,
                     root: Path | None, tags: dict[str, str] | None) -> Trackers | None:
    """The federation's picture saved, the trackers opened and mirrored by the metrics writer."""
    # numpy's stub types **arrays as allow_pickle's bool; the keys are partition_view's array names
    np.savez_compressed(rec.run_dir / FEDERATION, **prep.view(config.seed))  # type: ignore[arg-type]
    trackers = open_trackers(config, rec.run_dir, prep.heterogeneity.as_dict(), resumed=resume, root=root,
                             tags=tags, warn=lambda line: warn.print(line, style="yellow", soft_wrap=True))
    rec.writer.mirror = trackers
    return trackers


def _by_executor(plans: list[MethodPlan]) -> Iterator[tuple[ExecutorKind, list[MethodPlan]]]:
    """Consecutive methods on the same executor kind, each group opened once (one start of Flower's engine)."""
    for _, group in groupby(plans, key=lambda p: id(p.executor)):
        methods = list(group)
        yield methods[0].executor, methods


def execute(execution: Execution, plans: list[MethodPlan], status: Console | None) -> None:
    """Each executor opened for its methods (none for methods a resumed run has finished), the methods trained
    in its session."""
    rec = execution.recording
    for kind, group in _by_executor(plans):
        todo = [p for p in group if p.method.label not in rec.checkpointer.done]
        if not todo:
            continue  # finished before the interruption: its rows are in the checkpoint's methods already
        opening = Opening(execution.config, execution.fed.n_clients, rec.run_dir / EXECUTOR_LOG, status)
        with kind.open(opening) as session:
            session.run(partial(_train_methods, execution, todo))


def _train_methods(execution: Execution, plans: list[MethodPlan], steps: ClientSteps) -> None:
    """The methods of one session, one after the other, each recorded as finished when it is."""
    rec = execution.recording
    for p in plans:
        rec.heartbeat.beat(method=p.method.label)
        state = rec.current if rec.current is not None and rec.current["index"] == p.index else None
        rec.methods.update(train_method(execution, p, steps(p.index), state))
        rec.checkpointer.method_done(p.method.label)


def train_method(execution: Execution, p: MethodPlan, executor: Executor,
                 resume: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """One method: its federated rounds, then (if the algorithm has one) its personalisation step; returns its
    table rows — one, or one per view (FedMoE's Local, FedAvg, Fine-tuned and Mixture). ``resume`` is this
    method's part of a checkpoint to continue from (resumed after its rounds, the loop only restores)."""
    config, fed, rec, algo = execution.config, execution.fed, execution.recording, p.algo
    label = p.method.label
    fed_label = row_name(p.method, algo.capabilities.federated_view) if algo.capabilities.views else label
    task = execution.bar.add_task(fed_label, total=p.train.rounds, acc="-", rate="")
    earlier = resume["result"].train_seconds + resume["result"].eval_seconds if resume else 0.0
    t0 = time.perf_counter() - earlier
    kept = [] if p.executor.in_process else client_state_keys(algo)  # what a remote resume could not re-establish
    saver = CheckpointObserver(rec.checkpointer, p.index, label, kept, p.executor.in_process)
    observers = [MetricsObserver(rec.writer, fed_label), ProgressObserver(execution.bar, task, rec.heartbeat), saver]
    inversion = (InversionObserver(p.run, fed, config.leakage) if reads(config.leakage) == "update"
                 else None)
    observers += [inversion] if inversion is not None else []
    result = simulate(p.run, fed, executor=executor, observers=observers, attack=config.attack,
                      resume=resume["result"] if resume else None, resume_states=resume["states"] if resume else None,
                      history=False)  # every evaluation is in metrics.csv
    ended = result.rounds_done  # below train.rounds when a run stops early (patience, time limit, divergence)
    execution.bar.update(task, total=ended, completed=ended)
    fed_seconds = time.perf_counter() - t0
    if algo.capabilities.views and not (resume is not None and resume["phase"] == "personalised"):
        _personalise(execution, p, result, saver)
    rows = method_rows(execution, p, result, fed_seconds, time.perf_counter() - t0)
    if inversion is not None:
        _leaked(rec.run_dir, rows, fed_label, inversion.found,
                {"attack": config.leakage.kind, "client": config.leakage.client, "round": config.leakage.round})
    elif reads(config.leakage) == "model":
        chosen = result.best_server or result.server
        views: list[str | None] = list(algo.capabilities.views) or [None]
        for view in views:  # the model each row reports: a method's, or a view's
            found = membership(p.run, executor, fed, chosen, config.leakage, view)
            _leaked(rec.run_dir, rows, row_name(p.method, view) if view is not None else label, found,
                    {"attack": config.leakage.kind})
    return rows


def _leaked(run_dir: Path, rows: dict[str, dict[str, Any]], row: str, found: Found, about: dict[str, Any]) -> None:
    """What the server learnt about a row's method: its numbers beside the accuracy, its arrays in leakage/."""
    rows[row]["leakage"] = {**about, **found.numbers}
    if found.arrays:
        (run_dir / LEAKAGE).mkdir(exist_ok=True)
        np.savez_compressed(run_dir / LEAKAGE / f"{row}.npz", **found.arrays)  # type: ignore[arg-type]  # numpy's stub


def _personalise(execution: Execution, p: MethodPlan, result: SimulationResult, saver: CheckpointObserver) -> None:
    """The client-side step after federated training, its progress shown, then checkpointed."""
    bar, heartbeat, seed = execution.bar, execution.recording.heartbeat, execution.config.seed
    task = bar.add_task(f"{p.method.label}:personalise", total=len(p.algo.personal_plan(execution.fed, seed).clients),
                        acc="-", rate="clients")
    personalise(p.run, execution.fed, result, resolve_device(p.train.device, p.train.capture),
                on_chunk=partial(_personalised_so_far, bar, task, heartbeat))
    saver.checkpoint(result, "personalised")


def _personalised_so_far(bar: Any, task: Any, heartbeat: Heartbeat, done: int, total: int) -> None:
    bar.update(task, completed=done)
    heartbeat.beat()


def method_rows(execution: Execution, p: MethodPlan, result: SimulationResult, fed_seconds: float,
                seconds: float) -> dict[str, dict[str, Any]]:
    """The method's final states saved under checkpoints/, and its rows: one, or one per view (each view's
    evaluation written to metrics.csv)."""
    method, algo, rec = p.method, p.algo, execution.recording
    label = method.label
    ckpt = rec.run_dir / CHECKPOINTS
    ckpt.mkdir(exist_ok=True)
    save_client_states(result.states, ckpt / f"{label}-clients.pt")

    def save(state: ServerState, name: str) -> None:  # the model the method reports (what was scored) and what
        torch.save({k: v.cpu() for k, v in reported(algo, state).params.items()}, ckpt / f"{label}-{name}.pt")
        kept = served(algo, state)  # its clients predict with besides (FedFomo's rows, FedProto's prototypes)
        if kept is not None:
            torch.save(kept, ckpt / f"{label}-{name}-served.pt")

    if not algo.capabilities.views:
        save(result.server, "final")
        if result.best_server is not None:
            save(result.best_server, "best")
        return {label: {**method_summary(result, seconds), "algorithm": method.algorithm}}
    save(result.best_server or result.server, "global-best")
    rows = {}
    for view in algo.capabilities.views:
        name = row_name(method, view)
        row, rnd = view_row(algo, view, result, fed_seconds)
        write_evaluation(rec.writer, name, rnd, result.views[view])
        rows[name] = {**row, "algorithm": f"{method.algorithm}:{view}"}
    return rows


def summarise(config: Config, prep: Prepared, rec: Recording, t_start: float) -> dict[str, Any]:
    """``summary.json`` written last, the status "complete", the resumable checkpoints removed (the final
    states are in checkpoints/)."""
    rec.checkpointer.wait()
    rec.writer.close()
    summary = run_summary(config, prep, rec.methods, rec.started, rec.checkpointer.resumes,
                          time.perf_counter() - t_start)
    write_json_atomic(rec.run_dir / SUMMARY, summary)
    rec.heartbeat.stop()  # before the final status: the timer must not write "running" over it
    set_status(rec.run_dir, "complete")
    remove_checkpoints(rec.run_dir)
    return summary


def _mark_failed(rec: Recording, trackers: Trackers | None, err: BaseException) -> None:
    """The run directory marked failed with the reason; what was finished is kept (the reason itself is
    printed once, by whoever handles the error: the CLI).

    The status is written first, before the last checkpoint's write (two fsyncs) is waited for: killed after the
    status, the run keeps its previous checkpoint (each is written whole or not at all). A ServerApp that ``flwr stop``
    ends says this from Flower's exit handler, before Flower's timer to kill it starts
    (:mod:`hetfed.flower.server_app`)."""
    rec.heartbeat.stop()  # before the status: its timer must not write "running" over it
    set_status(rec.run_dir, "failed", reason=interruption_reason(err), methods_done=list(rec.methods))
    with contextlib.suppress(Exception):  # the run fails with its own error; the previous checkpoint stays
        rec.checkpointer.wait()
    rec.writer.close()
    if trackers is not None:
        trackers.finish(rec.run_dir, None, "failed")
    make_console(stderr=True).print(f"run marked failed; what was finished is kept in {rec.run_dir}", soft_wrap=True)


def save_client_states(states: Any, path: Path) -> None:
    """Every client's local parameters (no optimiser state), stacked by client id, for prediction later.

    Nothing is written when the clients keep no local parameters (FedAvg) or live
    elsewhere (Flower SuperNodes keep their own).
    """
    from hetfed.engine.client_store import ClientStore
    from hetfed.engine.types import OPT_PREFIX

    if not isinstance(states, ClientStore):
        return
    ids, stacked = states.stacked(keep=lambda name: not name.startswith(OPT_PREFIX))
    if ids:
        torch.save({"client_ids": ids, "states": stacked}, path)


def client_state_keys(algo: Algorithm) -> list[str]:
    """What an algorithm's clients keep between rounds (CGAU's conditioning rows, SCAFFOLD's control variates,
    kept optimiser state …); empty when they keep nothing."""
    from hetfed.engine.rng import CLIENT_INIT, torch_gen

    return sorted(algo.client_init(0, torch_gen(0, CLIENT_INIT, 0)))


def resume_experiment(run_dir: str | Path, progress: bool = True, console: Console | None = None,
                      present: Callable[[Path, Console | None], None] | None = None) -> RunOutput:
    """Continue a failed or killed ``hetfed run`` from its last checkpoint (``hetfed run --resume DIR``).

    The run's own ``config.yaml`` is used, so the resumed run is the same run; a
    complete run, or one whose process is still alive, is refused.
    """
    path = Path(run_dir)
    config = resumable_config(path)
    return run_experiment(config, out=path, progress=progress, console=console, present=present, resume=True)


def resumable_config(path: Path) -> Config:
    """The config of a run that may be resumed (failed or killed); a RunError saying why otherwise."""
    if not (path / CONFIG).is_file():
        raise RunError(f"--resume {str(path)!r}: no config.yaml there; expected a run directory written by hetfed run")
    state = run_state(path)
    if state == "complete":
        raise RunError(f"--resume {str(path)!r}: the run is already complete (status.json); nothing to resume")
    if state == "running":
        raise RunError(f"--resume {str(path)!r}: the run is still running (its process is alive); expected a failed "
                       "or killed run")
    return load_run_config(path / CONFIG)
