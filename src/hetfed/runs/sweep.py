"""``hetfed sweep``: a grid of config values × seeds, aggregated with 95% CIs.

Every grid point × seed is a full run directory under the sweep directory
(``<key>=<value>,…/seed=<s>``; with ``each_method``, one a method: ``…/seed=<s>/method=<label>``). Points that
differ only in the seed share a partition kind but not a split (the seed changes the split, as it should for an
honest estimate of variance). The aggregate ``sweep.csv`` has one row per grid
point × method × metric: mean, 95% CI half-width (Student t), n. Γ per grid
point is aggregated as method ``(data)``.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from rich.console import Console

from hetfed.config import Config, as_given, build_config
from hetfed.console import make_console
from hetfed.engine.host_memory import keep_freed_memory
from hetfed.errors import ConfigError, HetfedError, RunError
from hetfed.pipeline import sharing
from hetfed.runs.plan import check_config, check_devices
from hetfed.runs.rundir import (
    CONFIG,
    CURVES_TABLE,
    HETEROGENEITY_TABLE,
    RUNS_TABLE,
    SWEEP_RECORD,
    SWEEP_REQUEST,
    SWEEP_TABLE,
    check_out,
    new_run_dir,
    write_json_atomic,
)
from hetfed.runs.summary import stop_line
from hetfed.runs.sweep_progress import RunLines, SweepProgress
from hetfed.runs.sweep_resume import check_resumable, fate, move_aside, resumed
from hetfed.runs.sweep_tables import (
    aggregate,
    method_dir,
    point_dir,
    point_name,
    print_table,
    print_tuned,
    shown_point,
    value_key,
    write_curves,
    write_heterogeneity,
    write_runs,
    write_table,
)


def grid_points(grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    keys = list(grid)
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*(grid[k] for k in keys))]


def run_sweep(
    config: Config,
    grid: dict[str, list[Any]],
    seeds: int = 3,
    out: str | Path | None = None,
    progress: bool = True,
    console: Console | None = None,
    resume: bool = False,
    jobs: int = 1,
    present: Callable[[Path, Console | None], None] | None = None,
    stack: bool = False,
    each_method: bool = False,
) -> tuple[Path, list[dict[str, Any]]]:
    """Run every grid point × seed; write sweep.csv / sweep.json; return the table.

    ``present(sweep_dir, console)`` draws the figures and the report from what the sweep wrote
    (:func:`hetfed.analysis.present.present_sweep`; the entry points pass it).

    ``jobs`` > 1 runs the points in that many worker processes, each with
    ``cores // jobs`` torch threads (two 2-thread torch processes on 2 cores run
    ~10× slower than one), and gives the same table as running them one by one.

    ``stack`` trains the runs in threads of this process, each round's client steps of every run as one stack
    of clients (:mod:`hetfed.executors.stacked_runs`; the same numbers as one by one: equal to the bit on a CPU).

    ``each_method`` makes each of a point's methods a run of its own (``seed=<s>/method=<label>``): a run's methods
    share its federation and seed and nothing else (each keeps the server data the whole config resolves:
    :func:`_each_method`), so their numbers are the whole run's, and the tables gather them as one run's. Why:
    within a run the methods train one after another, so a stacked sweep's stack held one method's runs at a time;
    split, every method's runs train side by side — sharing a stack where their steps or evaluations are the same
    computation — and ``jobs`` spreads one point's methods over the workers.

    With ``resume``, ``out`` may hold an earlier run of this sweep: a completed run
    directory whose resolved config matches is reused; a failed or killed one with a
    checkpoint continues from it (``hetfed run --resume``); any other incomplete one is
    moved aside (``<dir>.incomplete-<n>``, never deleted) and run again.
    """
    console = console or make_console()
    configs = _checked(config, grid, seeds, out, resume, jobs, stack, each_method)
    fates = _fates(configs, resumed(out, resume))
    with sharing():  # runs that differ only in methods, training or server settings share their preparation
        if any(what != "reuse" for what, _summary in fates):  # a finished sweep resumed for its tables loads no data
            _refuse_unplannable(configs, make_console(stderr=True) if progress else None)  # as a run's loading shows
        sweep_dir = _open_sweep_dir(config, grid, configs, out, resume, each_method)
        outcome = _execute_sweep(sweep_dir, configs, fates, jobs, console if progress else None, stack)
    summaries, runs, failed = _collect(sweep_dir, configs, outcome)
    table = _summarise_sweep(sweep_dir, grid, seeds, summaries, runs, failed)
    if present is not None:  # figures and report.html: hetfed.analysis.present.present_sweep
        present(sweep_dir, console)
    if progress:
        stopped = any(stop_line(name, m) for _point, _seed, run in summaries for name, m in run["methods"].items())
        print_table(table, list(grid), console, rounds=stopped)  # the rounds each method ran, when some stopped early
        print_tuned(table, list(grid), console)
    if failed:
        console.print(f"{len(failed)} of {len(configs)} runs failed (listed in sweep.json)", style="red")
    console.print(f"sweep directory: {sweep_dir}", soft_wrap=True)
    if not summaries:
        raise RunError(f"every run of the sweep failed; see {sweep_dir / 'sweep.json'}")
    return sweep_dir, table


def _check_arguments(config: Config, seeds: int, out: str | Path | None, resume: bool, jobs: int, stack: bool) -> None:
    """What is refused before any point runs or any file is written (every point would fail the same way): the
    sweep's own arguments (an ``out`` to make that is a file or not empty), a tracker that is not installed, a value
    of ``HETFED_MALLOC`` (whose allocator setting is made here, once a process)."""
    from hetfed.runs.tracking import check_trackers

    if jobs < 1:
        raise ConfigError(f"--jobs {jobs} is not allowed: expected ≥ 1 (worker processes)")
    if seeds < 1:
        raise ConfigError(f"--seeds {seeds} is not allowed: expected ≥ 1")
    if resume and out is None:
        raise ConfigError("--resume needs --out: the directory of the sweep to resume")
    if stack and jobs > 1:
        raise ConfigError(f"--stack with --jobs {jobs} is not allowed: expected one of them (--stack trains every "
                          "run in this process, --jobs in worker processes)")
    if resumed(out, resume) is None:
        check_out(out, what="the sweep")  # before the data are loaded for the plan's check
    keep_freed_memory()
    check_trackers(config.tracking)


class SweepRun(NamedTuple):
    """One run of a sweep: its grid point, its seed's index, its validated config and — a sweep of each method
    apart — the label of the point's one method it trains (None: the point's config whole)."""

    point: dict[str, Any]
    s: int
    cfg: Config
    method: str | None = None

    @property
    def shown(self) -> dict[str, Any]:
        """The point as the progress lines name the run: with its method where it trains one of the point's."""
        return shown_point(self.point, self.method)


def plan_sweep(config: Config, grid: dict[str, list[Any]], seeds: int, each_method: bool = False) -> list[SweepRun]:
    """Every point × seed validated before anything runs; equal points refused, unread grid values noted;
    ``each_method``: each then split into a run per method (:func:`_each_method`)."""
    for key, values in grid.items():  # no value: a sweep of no runs (its tables empty, its dry run nothing to list)
        if not len(values):
            raise ConfigError(f"grid {key} = [] is not allowed: expected one value or more")
    base = as_given(config)
    configs = [SweepRun(point, s, build_config(base, {**point, "seed": config.seed + s}))
               for point in grid_points(grid) for s in range(seeds)]
    for run in configs:
        if run.s == 0:  # for every point before anything runs: the checks between components, the devices
            check_config(run.cfg)
            check_devices(run.cfg)
    _refuse_equal_points([(run.point, run.cfg) for run in configs if run.s == 0])
    _note_unread_grid_keys([run.cfg for run in configs if run.s == 0], list(grid))
    return [part for run in configs for part in _each_method(run)] if each_method else configs


def _refuse_unplannable(configs: list[SweepRun], status: Console | None = None) -> None:
    """A sweep none of whose runs its federation or its plan would accept (kNN-Per on a model with no hidden layer:
    a check that needs the data) refused with the first run's one-line error, before its folder is written. The
    runs are tried in order until one plans, first seeds first: usually the first — its federation built here is
    the one its run then prepares on (:func:`sharing`; in ``--jobs`` workers, built again). One impossible point
    among possible ones is the sweep's to record (``failed`` in sweep.json), not a refusal. ``status`` shows the
    loading (an embedding not yet cached takes minutes)."""
    refused: list[HetfedError] = []
    for run in sorted(configs, key=lambda run: run.s):
        if (why := _refusal(run, status)) is None:
            return
        refused.append(why)
    if refused:  # every run refused
        raise refused[0]


def _fates(configs: list[SweepRun], existing: Path | None) -> list[tuple[str, dict[str, Any] | None]]:
    """What the sweep does with each run's folder in the sweep it resumes (:func:`fate`: a reused run's summary
    with it), read once for the sweep's plan check and its runs; in a new sweep, every run is trained."""
    return [fate(_run_dir(existing, run), run.cfg, True) if existing is not None else ("train", None)
            for run in configs]


def _refusal(run: SweepRun, status: Console | None = None) -> HetfedError | None:
    """Why ``run``'s federation or plan refuses its config (a check that needs the data: a setting, a partition
    that cannot be made, data that cannot be read), or None."""
    from hetfed.pipeline import build_federation
    from hetfed.runs.plan import plan

    try:
        plan(run.cfg, build_federation(run.cfg, progress=status is not None, status=status).federation, None)
    except HetfedError as err:
        return err
    return None


def _each_method(run: SweepRun) -> list[SweepRun]:
    """``run`` as one run per method of its config, in its order: each the config with that method alone, and what
    the whole config resolves from its set of methods kept — the server's data (``server_data.source: auto`` cuts a
    holdout from the clients' pool when any method needs one: FedAvg beside FedDF trains on less data than alone)."""
    from hetfed.server_data import wanted

    given = as_given(run.cfg)
    given["server_data"] = {**given.get("server_data", {}), "source": wanted(run.cfg)}
    return [SweepRun(run.point, run.s, build_config({**given, "methods": [entry]}), method.label)
            for entry, method in zip(given["methods"], run.cfg.methods, strict=True)]


def _run_dir(sweep_dir: Path, run: SweepRun) -> Path:
    seed = sweep_dir / point_dir(run.point) / f"seed={run.cfg.seed}"
    return seed if run.method is None else seed / method_dir(run.method)


def _open_sweep_dir(config: Config, grid: dict[str, list[Any]], configs: list[SweepRun], out: str | Path | None,
                    resume: bool, each_method: bool = False) -> Path:
    """A new sweep directory, or the earlier one being resumed (checked to be this sweep); the request kept."""
    request = {"config": config.model_dump(mode="json"),
               "grid": {k: [value_key(v) for v in vs] for k, vs in grid.items()},
               **({"each_method": True} if each_method else {})}
    sweep_dir = resumed(out, resume)
    if sweep_dir is not None:
        check_resumable(sweep_dir, [(_run_dir(sweep_dir, run), run.cfg) for run in configs], each_method)
    else:
        sweep_dir = new_run_dir(out, config.out_dir, f"{config.name}-sweep")
    write_json_atomic(sweep_dir / SWEEP_REQUEST, request)
    return sweep_dir


def dry_run(config: Config, grid: dict[str, list[Any]], seeds: int = 3, out: str | Path | None = None,
            resume: bool = False, jobs: int = 1, stack: bool = False, each_method: bool = False,
            status: Console | None = None) -> list[tuple[Path, str]]:
    """The runs :func:`run_sweep` of these arguments would make, checked as it checks them before writing anything
    (:func:`_checked`) and each it would not reuse planned on its own data: each run's folder within the sweep's and
    what the sweep would do with it (``train``; ``refused: <why>``, a run the sweep would record as failed; resuming
    ``out``: ``reuse``, ``continue`` or ``redo``, :func:`hetfed.runs.sweep_resume.fate`), nothing trained or
    written; a sweep every run of which is refused is refused as the sweep refuses it (``status``: where the loading
    shows). Why: ``hetfed sweep --dry-run`` checks a long study (a lent GPU's few minutes) on a laptop first."""
    configs = _checked(config, grid, seeds, out, resume, jobs, stack, each_method)
    existing = resumed(out, resume)
    if existing is not None:
        check_resumable(existing, [(_run_dir(existing, run), run.cfg) for run in configs], each_method)
    fates = [what for what, _summary in _fates(configs, existing)]
    todo = [i for i, what in enumerate(fates) if what != "reuse"]  # a reused run's plan passed when it ran
    with sharing():
        why = {i: _refusal(configs[i], None if n else status) for n, i in enumerate(todo)}  # the loading shown once
    if todo and all(why.values()):
        raise why[todo[0]]  # type: ignore[misc]  # all are errors
    return [(_run_dir(Path(), run), f"refused: {why[i]}" if why.get(i) is not None else fates[i])
            for i, run in enumerate(configs)]


def _checked(config: Config, grid: dict[str, list[Any]], seeds: int, out: str | Path | None, resume: bool,
             jobs: int, stack: bool, each_method: bool) -> list[SweepRun]:
    """The sweep's runs, after what needs no data is checked (a sweep and its dry run check the same)."""
    _check_arguments(config, seeds, out, resume, jobs, stack)
    configs = plan_sweep(config, grid, seeds, each_method)
    if stack:
        _check_stackable(configs)
    return configs


def _execute_sweep(sweep_dir: Path, configs: list[SweepRun], fates: list[tuple[str, dict[str, Any] | None]],
                   jobs: int, console: Console | None, stack: bool = False) -> dict[int, tuple[str, object]]:
    """Every run not already complete (resuming: ``fates``, :func:`_fates`), one by one or in ``jobs`` workers:
    run index → outcome."""
    todo: list[tuple[int, dict[str, Any], Config, Path]] = []  # each run's place, point as shown, config, folder
    outcome: dict[int, tuple[str, object]] = {}
    for i, (run, (what, summary)) in enumerate(zip(configs, fates, strict=True)):
        run_dir = _run_dir(sweep_dir, run)
        if what == "reuse":
            outcome[i] = ("ok", summary)
            continue
        if what == "redo":
            move_aside(run_dir)  # a run to continue does so from its checkpoint, in place
        todo.append((i, run.shown, run.cfg, run_dir))
    tracker = SweepProgress(len(configs), len(outcome), console, stacked=stack, time_limit=_time_limit(todo),
                            measures_gamma=any(cfg.heterogeneity.gamma for _i, _p, cfg, _d in todo))
    if stack and todo:
        methods = max(len(cfg.methods) for _i, _p, cfg, _d in todo)
        tracker.begin(len(todo), "stacked: each prepares its clients, then their rounds run together" + (
            f"; each run's {methods} methods one after another (--each-method stacks them side by side)"
            if methods > 1 else ""))
        outcome.update(_run_stacked(todo, tracker, sweep_dir))
    elif jobs > 1 and len(todo) > 1:
        tracker.begin(len(todo), f"in {jobs} processes")
        outcome.update(_run_parallel(todo, jobs, tracker, sweep_dir))
    else:
        tracker.begin(len(todo), "one at a time")
        for place, (i, point, cfg, run_dir) in enumerate(todo, len(outcome) + 1):
            tracker.started(point, cfg.seed)
            lines = tracker.within(place, point, cfg.seed)
            outcome[i] = _run_one(cfg.model_dump(mode="json"), str(run_dir), str(sweep_dir), lines=lines,
                                  console=tracker.console)
            tracker.finished(point, cfg.seed, outcome[i])
    return outcome


def _collect(sweep_dir: Path, configs: list[SweepRun], outcome: dict[int, tuple[str, Any]]
             ) -> tuple[list[tuple[dict[str, Any], int, dict[str, Any]]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The summaries by grid point × seed (the runs of one point's methods, run apart, gathered as the point's
    one run: Γ and the data from the first, every method's rows in the config's order), the runs that finished
    (point, seed, folder — and method, where apart) and the failed ones, in grid order, however they were run (one
    impossible point must not lose the rest of the grid)."""
    gathered: dict[tuple[str, int], tuple[dict[str, Any], int, dict[str, Any]]] = {}
    runs: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []
    for i, run in enumerate(configs):
        run_dir, (status, value) = _run_dir(sweep_dir, run), outcome[i]
        method = {} if run.method is None else {"method": run.method}
        if status != "ok":
            failed.append({"point": run.point, "seed": run.cfg.seed, **method, "error": str(value),
                           "run_dir": str(run_dir)})
            continue
        runs.append({"point": run.point, "seed": run.cfg.seed, **method, "run_dir": str(run_dir)})
        key = (point_dir(run.point), run.cfg.seed)
        if key in gathered:
            gathered[key][2]["methods"].update(value["methods"])
        else:
            gathered[key] = (run.point, run.cfg.seed, {**value, "methods": dict(value["methods"])})
    return list(gathered.values()), runs, failed


def _summarise_sweep(sweep_dir: Path, grid: dict[str, list[Any]], seeds: int, summaries: list[Any],
                     runs: list[dict[str, Any]], failed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """sweep.json (the runs listed before anything is aggregated: a failure below never hides them), then the
    tables: sweep.csv, runs.csv, curves.csv, heterogeneity.csv."""
    record = {"grid": grid, "seeds": seeds, "runs": runs, "failed": failed}
    write_json_atomic(sweep_dir / SWEEP_RECORD, record)
    keys = list(grid)
    try:
        table = aggregate(summaries, keys)
        write_table(sweep_dir / SWEEP_TABLE, table, keys)
        write_runs(sweep_dir / RUNS_TABLE, summaries, keys)
        write_curves(sweep_dir / CURVES_TABLE, [(r["point"], r["seed"], Path(r["run_dir"])) for r in runs], keys)
        write_heterogeneity(sweep_dir / HETEROGENEITY_TABLE, table, keys)
    except Exception as err:
        write_json_atomic(sweep_dir / SWEEP_RECORD, {**record, "aggregation_error": f"{type(err).__name__}: {err}"})
        raise RunError(
            f"aggregating the sweep failed ({type(err).__name__}: {err}); every run's results are kept in its "
            f"run directory, listed in {sweep_dir / SWEEP_RECORD}"
        ) from err
    write_json_atomic(sweep_dir / SWEEP_RECORD, {**record, "rows": table})
    return table


def _note_unread_grid_keys(configs: list[Config], keys: list[str]) -> None:
    """A note for each grid value that what its point chose does not read (``--grid partition.alpha=…`` with
    ``feature_clusters``): those points run the same training under different names."""
    import warnings

    from hetfed.config import UnreadKey, unread_keys

    for cfg in configs:
        for where, note in unread_keys(cfg).items():  # a method's own key is methods.<i>.<the grid's key>
            if where in keys or (where.startswith("methods.") and where.split(".", 2)[2] in keys):
                warnings.warn(f"--grid: {note}", UnreadKey, stacklevel=3)


def _refuse_equal_points(points: list[tuple[dict[str, Any], Config]]) -> None:
    """Two grid points that resolve to the same config (``0,0``, ``0,0.0``) would be the same runs counted twice:
    statistics over copies, not seeds."""
    seen: dict[str, dict[str, Any]] = {}
    for point, cfg in points:
        key = json.dumps(cfg.model_dump(mode="json"), sort_keys=True)
        if key in seen:
            first = seen[key]
            differ = [f"{k}: {value_key(first[k])} and {value_key(point[k])}" for k in point
                      if value_key(first[k]) != value_key(point[k])]
            what = (f"values {'; '.join(differ)} are the same setting once validated" if differ else
                    f"point {point_name(point)} is listed twice")
            raise ConfigError(f"--grid {what}: that point would run twice and count as two seeds; expected each "
                              "value once")
        seen[key] = point


def _run_one(raw: dict[str, Any], run_dir: str, sweep_dir: str, executor: Any = None, lines: RunLines | None = None,
             console: Console | None = None) -> tuple[str, object]:
    """One grid point × seed (or one of its methods): ("ok", summary) or ("failed", the one-line error). Runs in a
    worker (or a thread of a stacked sweep, ``executor`` its shared kind) too; ``lines``: where its rounds are told
    (on ``console``, or one of the worker's own)."""
    from hetfed.runs.runner import run_experiment

    resume = (Path(run_dir) / CONFIG).is_file()  # left in place by --resume: it has a checkpoint
    try:
        sweep, within = Path(sweep_dir), Path(run_dir).relative_to(sweep_dir)
        return "ok", run_experiment(build_config(raw), out=run_dir, progress=False, resume=resume, executor=executor,
                                    display=lines.display(console) if lines is not None else None,
                                    tracking_root=sweep,  # one MLflow store
                                    tracking_tags={"hetfed.sweep": sweep.name, "hetfed.point": within.parts[0],
                                                   "hetfed.run_name": within.as_posix()}).summary
    except HetfedError as err:
        return "failed", str(err)


def _init_worker(threads: int, jobs: int = 1) -> None:
    """Each worker gets its share of the cores — torch's threads and numpy's and scipy's BLAS alike
    (:func:`~hetfed.engine.host_threads.limit_threads`) — and of a GPU's memory where its runs leave
    ``train.memory_budget_mb`` unset (:func:`~hetfed.executors.inprocess.share_gpu`), and shares the data and
    preparations of the runs it is given (each seed's partition and Γ once in a worker, not once a run)."""
    from hetfed.engine.host_threads import limit_threads
    from hetfed.executors.inprocess import share_gpu
    from hetfed.pipeline import share_in_this_process

    limit_threads(threads)
    share_gpu(jobs)
    share_in_this_process()


def worker_threads(jobs: int) -> int:
    """Each of ``jobs`` workers' threads: its share of the cores other processes leave idle."""
    from hetfed.engine.host_threads import usable_cores

    return max(1, usable_cores() // jobs)


def _run_parallel(todo: list[tuple[int, dict[str, Any], Config, Path]], jobs: int,
                  tracker: SweepProgress, sweep_dir: Path) -> dict[int, tuple[str, object]]:
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    out: dict[int, tuple[str, object]] = {}
    context = multiprocessing.get_context("spawn")  # no torch state inherited from this process
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_init_worker,
                             initargs=(worker_threads(jobs), jobs)) as pool:
        pending = {}
        try:
            for place, (i, point, cfg, run_dir) in enumerate(todo, tracker.done + 1):
                lines = tracker.within(place, point, cfg.seed)
                pending[pool.submit(_run_one, cfg.model_dump(mode="json"), str(run_dir), str(sweep_dir), None,
                                    lines)] = (i, point, cfg)
                tracker.started(point, cfg.seed)
            while pending:
                done, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in done:
                    i, point, cfg = pending.pop(future)
                    out[i] = future.result()
                    tracker.finished(point, cfg.seed, out[i])
        except BaseException:
            for future in pending:
                future.cancel()
            raise
    return out


def _stacking_kind() -> Any:
    from hetfed.registry import registry_of

    return next(kind for _name, kind in registry_of("executor").items() if kind.stacks_runs)


def _check_stackable(configs: list[SweepRun]) -> None:
    """--stack trains every run with the stacking kind: a method must be configured with an executor it may stand
    in for (``stackable``: the vectorised one), never another silently replaced."""
    from hetfed.registry import registry_of

    executors = registry_of("executor")
    usable = sorted(name for name, kind in executors.items() if kind.stackable)
    for cfg in (run.cfg for run in configs):
        for method in cfg.methods:
            name = cfg.method_train(method).executor
            if not executors.get(name).stackable:
                raise ConfigError(f"train.executor = {name!r} (method {method.name!r}) cannot be stacked: --stack "
                                  f"trains every run's clients as one stack; expected train.executor "
                                  f"{' or '.join(map(repr, usable))} with --stack, or the sweep without --stack")
            if registry_of("algorithm").get(method.algorithm).capabilities.asynchronous:
                raise ConfigError(f"methods algorithm = {method.algorithm!r} (method {method.label!r}) cannot be "
                                  "stacked across runs: its server works on its own clock; expected the sweep without "
                                  "--stack")


def _run_stacked(todo: list[tuple[int, dict[str, Any], Config, Path]],
                 tracker: SweepProgress, sweep_dir: Path) -> dict[int, tuple[str, object]]:
    """Every run on a thread of its own, their rounds' client steps computed together (the stacking kind)."""
    import threading

    kind = _stacking_kind().for_runs(len(todo), on_round=tracker.stacked_round, on_ready=tracker.stacked_ready)
    out: dict[int, tuple[str, object]] = {}
    lock = threading.Lock()
    stopped: list[KeyboardInterrupt] = []  # Ctrl-C or SIGTERM, relayed to every run's thread

    def one(i: int, point: dict[str, Any], cfg: Config, run_dir: Path) -> None:
        kind.join()
        try:
            outcome: tuple[str, object] = _run_one(cfg.model_dump(mode="json"), str(run_dir), str(sweep_dir), kind)
        except BaseException as err:  # noqa: BLE001  (a bug in one run must not hang the others)
            outcome = ("failed", f"{type(err).__name__}: {err}")
            if isinstance(err, KeyboardInterrupt):
                stopped.append(err)
        finally:
            kind.leave()
        with lock:
            out[i] = outcome
            tracker.finished(point, cfg.seed, outcome)

    threads = [threading.Thread(target=one, args=job, name=f"run-{job[0]}", daemon=True) for job in todo]
    for (_i, point, cfg, _d), thread in zip(todo, threads, strict=True):
        tracker.started(point, cfg.seed)
        thread.start()
    kind.serve()  # this thread computes the runs' client work until the last one leaves
    for thread in threads:
        thread.join()
    if stopped:  # each run is marked stopped; the sweep stops as one run at a time does (exit 143 or 130, no tables)
        raise stopped[0]
    return out


def _time_limit(todo: list[tuple[int, dict[str, Any], Config, Path]]) -> float | None:
    """The longest ``train.time_limit`` of the runs' methods, or None when any of them has none."""
    limits = [cfg.method_train(m).time_limit for _i, _point, cfg, _dir in todo for m in cfg.methods]
    known = [limit for limit in limits if limit is not None]
    return max(known) if known and len(known) == len(limits) else None
