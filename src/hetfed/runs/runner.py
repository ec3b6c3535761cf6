"""``hetfed run``: every configured method on the same federation, one run directory.

The data, the federation and every model are built (and so validated) before
the run directory is created; from then on the directory is either completed
(``summary.json`` written last, status "complete") or marked "failed" with the
reason — including Ctrl-C.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from rich.console import Console
from rich.table import Table

from hetfed.algorithms import algorithm_for
from hetfed.config import Config, MethodConfig, dump_config
from hetfed.console import make_console, round_progress
from hetfed.engine.evaluate import Evaluation
from hetfed.engine.sampling import clients_per_round
from hetfed.errors import ConfigError, RunError, interruption_reason
from hetfed.executors.inprocess import check_memory
from hetfed.executors.simulate import SimulationResult, personalise, resolve_device, simulate
from hetfed.pipeline import Prepared, prepare
from hetfed.runs.checkpoint import Checkpointer, read_checkpoint, remove_checkpoints, snapshot
from hetfed.runs.rundir import (
    CHECKPOINTS,
    CONFIG,
    FEDERATION,
    FLOWER_LOG,
    METRICS,
    SUMMARY,
    Heartbeat,
    MetricsWriter,
    check_out,
    environment,
    new_run_dir,
    set_status,
    write_json_atomic,
)
from hetfed.runs.tracking import check_trackers, open_trackers

#: metrics shown in the final table and compared across methods
HEADLINE = ("global_accuracy", "local_accuracy_mean")

@dataclass(frozen=True, eq=False)
class RunOutput:
    run_dir: Path
    summary: dict


def _clean(metrics: dict[str, float]) -> dict[str, float | None]:
    """JSON-safe metrics: NaN and ±inf (ε without noise) become None."""
    return {k: (None if (isinstance(v, float) and not np.isfinite(v)) else float(v)) for k, v in metrics.items()}


def method_summary(result: SimulationResult, seconds: float) -> dict:
    final = result.history[-1][1].metrics if result.history else {}
    best = result.best.metrics if result.best else final
    return {
        "final": _clean(final),
        "best": _clean(best),
        "local_accuracy": _clean(best).get("local_accuracy_mean"),
        "global_accuracy": _clean(best).get("global_accuracy"),
        "selected_by": result.selected_by,
        **({} if result.selected_by else {
            "selection_note": "no opted-in client has validation data: nothing to select on, best = final; "
                              "early stopping cannot fire"}),
        "best_round": result.best_round,
        "rounds": result.rounds_done,
        "stopped_early": result.stopped_early,
        "wall_seconds": seconds,
        "seconds_per_round": result.train_seconds / max(result.rounds_done, 1),
        "server_seconds_per_round": result.server_seconds / max(result.rounds_done, 1),
        "eval_seconds": result.eval_seconds,
        "eval_seconds_per_evaluation": result.eval_seconds / max(result.evaluations, 1),
        **_failures(result),
    }


def _failures(result: SimulationResult) -> dict:
    """Clients that did not answer (Flower), the round's client counts summed, rounds skipped, and ε."""
    failed = list(getattr(result.executor, "failures", []))
    out: dict = {"clients": dict(result.faults)} if result.faults else {}
    if failed or result.skipped_rounds:
        out.update(failed_clients=failed, skipped_rounds=list(result.skipped_rounds))
    if result.diverged_at is not None:
        out["diverged_at"] = result.diverged_at
    if result.epsilon is not None:
        out["epsilon"] = result.epsilon if np.isfinite(result.epsilon) else None
        out["dp_rounds"] = result.dp_rounds
    from_summaries = getattr(result.executor, "gamma_summaries", None)  # Flower: Γ from what the clients sent
    if from_summaries:
        out["gamma_from_summaries"] = from_summaries
    return out


def _write_eval(writer: MetricsWriter, label: str, rnd: int, ev: Evaluation) -> None:
    writer.write(label, rnd, "summary", "all", ev.metrics)
    for metric, values in ev.per_client.items():
        for k, v in enumerate(values):
            writer.write(label, rnd, "client", k, {metric: v})
    writer.flush()


def run_experiment(
    config: Config,
    out: str | Path | None = None,
    progress: bool = True,
    console: Console | None = None,
    prepared: Prepared | None = None,
    flower_grid=None,
    present: Callable[[Path, Console | None], None] | None = None,
    resume: bool = False,
    tracking_root: Path | None = None,
    tracking_tags: dict[str, str] | None = None,
) -> RunOutput:
    """Run all methods of ``config``; returns the run directory and its summary.

    ``resume``: ``out`` is a failed or killed run of this ``config``; continue it from its
    checkpoint (see :mod:`hetfed.runs.checkpoint`), or from the start when it
    has none yet. What it finished is not redone and metrics.csv gets no row twice.

    ``present(run_dir, status)``: draw the run's figures and ``report.html`` at the end
    (:func:`hetfed.analysis.present.present_run`, passed by the entry points; a sweep
    presents all its runs at once instead). ``flower_grid`` (inside a Flower ServerApp): every method's clients are the
    SuperNodes of that federation, whatever ``train.executor`` says.

    ``tracking_root`` / ``tracking_tags``: where MLflow's default store lives and extra tags
    (a sweep passes its directory and point; see :mod:`hetfed.runs.tracking`).
    """
    console = console or make_console()
    status = make_console(stderr=True) if progress else None
    t_start = time.perf_counter()
    ckpt = None
    check_trackers(config.tracking)  # a tracker that is not installed is refused before anything is written
    if not resume:
        check_out(out)  # what needs no data is checked before loading it (minutes on embedded data)
    else:  # the checkpoint too: a refused resume says so before loading anything
        warn = (status or make_console(stderr=True)).print
        try:
            ckpt = read_checkpoint(Path(out), warn=lambda message: warn(message, style="yellow", soft_wrap=True))
        except RunError as err:  # refused: the run is not running any more, and says why
            set_status(Path(out), "failed", reason=f"resume refused: {err}")
            raise
    for method in config.methods:
        resolve_device(config.method_train(method).device)  # "cuda" without a GPU
    prep = prepared or prepare(config, progress=progress, status=status)
    fed = prep.federation
    for note in getattr(prep.data, "notes", ()):  # what loading kept (Shakespeare: roles, windows, sizes)
        (status or make_console(stderr=True)).print(note, soft_wrap=True, markup=False)
    for warning in prep.warnings:
        (status or make_console(stderr=True)).print(f"warning: {warning}", style="yellow", soft_wrap=True)
    n_opted_in = int((~np.asarray(fed.opted_out, dtype=bool)).sum())
    plans = []
    for method in config.methods:  # build everything first: bad settings fail before any file
        train = config.method_train(method)
        resolve_device(train.device)  # "cuda" without a GPU fails here, before any file
        clients_per_round(train, n_opted_in)  # an m that cannot be met fails here, not mid-run
        algo = algorithm_for(config, method, fed.input_shape, fed.n_classes)
        if config.attack.kind != "none" and (train.executor == "flower" or flower_grid is not None):
            raise ConfigError(f"attack.kind = {config.attack.kind!r} is simulated by the in-process executors only; "
                              f"expected methods.{config.methods.index(method)}.train.executor 'vectorised' or "
                              "'sequential' (on Flower the clients are real)")
        if train.executor != "flower" and flower_grid is None:  # what cannot fit is refused before any file
            check_memory(algo, fed, train)
        elif ckpt and ckpt.get("current") and ckpt["current"]["index"] == len(plans):  # before any file is touched
            check_flower_resumable(ckpt)
        plans.append((method, train, algo))

    if resume:
        run_dir = Path(out)
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
    methods: dict[str, dict] = dict(ckpt["methods"]) if ckpt else {}
    checkpointer = Checkpointer(run_dir, writer, methods, started,
                                resumes=ckpt["resumes"] + 1 if ckpt else int(resume))
    checkpointer.done = list(ckpt["done"]) if ckpt else []
    current = ckpt.get("current") if ckpt else None
    trackers = None
    try:
        from hetfed.partition import partition_view

        np.savez_compressed(run_dir / FEDERATION, **partition_view(fed, config.seed))
        warn_console = status or make_console(stderr=True)
        trackers = open_trackers(config, run_dir, prep.heterogeneity.as_dict(), resumed=resume, root=tracking_root,
                                 tags=tracking_tags,
                                 warn=lambda line: warn_console.print(line, style="yellow", soft_wrap=True))
        writer.mirror = trackers
        if ckpt is None:
            torch.manual_seed(config.seed)  # nothing should use the global generator; belt and braces
        with round_progress(progress, console) as bar:
            def run_methods(grid=flower_grid) -> None:
                for index, (method, train, algo) in enumerate(plans):
                    label = method.label
                    if label in checkpointer.done:
                        continue  # finished before the interruption: its rows are in methods already
                    heartbeat.beat(method=label)
                    state = current if current is not None and current["index"] == index else None
                    rows = _run_method(config, method, train, algo, fed, writer, bar, heartbeat, run_dir,
                                       grid, checkpointer, state)
                    methods.update(rows)
                    checkpointer.method_done(label)

            if flower_grid is None and all(train.executor == "flower" for _, train, _ in plans):
                # every method on the Simulation Engine: one start for them all, as on a deployment
                from hetfed.flower.simulation import run_with_simulation_grid

                run_with_simulation_grid(config, fed.n_clients, run_methods, log_file=run_dir / FLOWER_LOG,
                                         status=status)
            else:
                run_methods()
        writer.close()
        primary = primary_row(config.methods[0])
        het = prep.heterogeneity
        summary = {
            "name": config.name,
            "seed": config.seed,
            "dataset": config.dataset.name,
            "embed": config.embed.kind,
            "partition": config.partition.kind,
            "n_clients": fed.n_clients,
            "n_classes": fed.n_classes,
            "input_shape": list(fed.input_shape),
            "n_opted_out": int(fed.opted_out.sum()),
            "global_test_balanced": bool(getattr(prep.data, "balanced_test", True)),
            "gamma": het.gamma,
            "heterogeneity": het.as_dict(),
            "data_files": list(prep.sources),
            "warnings": list(prep.warnings),
            "primary": primary,
            "training": training_line(config),
            "final": methods[primary]["final"],
            "best": methods[primary]["best"],
            "rounds": max(m.get("rounds") or 0 for m in methods.values()),
            "wall_seconds": time.perf_counter() - t_start,
            **({"resumed": checkpointer.resumes} if checkpointer.resumes else {}),
            "started": started,
            "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "environment": environment(),
            "methods": methods,
        }
        write_json_atomic(run_dir / SUMMARY, summary)
        heartbeat.stop()  # before the final status: the timer must not write "running" over it
        set_status(run_dir, "complete")
        remove_checkpoints(run_dir)  # complete: the final states are in checkpoints/
    except BaseException as err:
        heartbeat.stop()
        writer.close()
        set_status(run_dir, "failed", reason=interruption_reason(err), methods_done=list(methods))
        if trackers is not None:
            trackers.finish(run_dir, None, "failed")
        # the reason itself is printed once, by whoever handles the error (the CLI)
        make_console(stderr=True).print(f"run marked failed; what was finished is kept in {run_dir}", soft_wrap=True)
        raise
    if present is not None:
        present(run_dir, status)
    if trackers is not None:  # after the figures and report.html, which it sends along
        trackers.finish(run_dir, summary, "complete")
    if progress:
        print_summary(summary, run_dir, console)
    return RunOutput(run_dir, summary)


def _rate(rounds: int, seconds: float) -> str:
    """Rounds per second, or seconds per round when rounds are slow (a Flower deployment)."""
    per_second = rounds / max(seconds, 1e-9)
    return f"{per_second:.1f} rounds/s" if per_second >= 1 else f"{seconds / max(rounds, 1):.1f} s/round"


def training_line(config: Config) -> str:
    """What was trained, for the final table's title: ``fedavg · 100 rounds · E = 1``."""
    algorithms = ", ".join(dict.fromkeys(m.algorithm for m in config.methods))
    trains = [config.method_train(m) for m in config.methods]
    rounds = sorted({t.rounds for t in trains})
    work = sorted({f"τ = {t.local_steps}" if t.local_steps else f"E = {t.local_epochs:g}" for t in trains})
    return f"{algorithms} · {'/'.join(map(str, rounds))} rounds · {', '.join(work)}"


def row_name(method: MethodConfig, view: str) -> str:
    """How a view of a method is named in tables: by the view's name when the method is named after its
    algorithm (FedMoE's ``mixture``), else ``label:view``."""
    return view if method.label == method.algorithm else f"{method.label}:{view}"


def primary_row(method: MethodConfig) -> str:
    """The row that is a method's headline result: its ``primary_view`` when it declares one (FedMoE's
    mixture), else the method itself."""
    from hetfed.algorithms import registry

    view = registry.get(method.algorithm).capabilities.primary_view
    return row_name(method, view) if view else method.label


def round_fields(metrics: dict | None, timing: dict[str, float], rnd: int) -> dict[str, str]:
    """The progress bar's fields after a round (:func:`hetfed.console.round_progress`): the global accuracy when
    the round was evaluated, and the throughput."""
    fields = {"acc": f"{metrics['global_accuracy']:.3f}"} if metrics and "global_accuracy" in metrics else {}
    fields["rate"] = f"{_rate(rnd, timing['train_s'])} · eval {timing['eval_s']:.1f} s"
    return fields


def _run_method(config, method: MethodConfig, train, algo, fed, writer, bar, heartbeat: Heartbeat,
                run_dir: Path, flower_grid=None, checkpointer: Checkpointer | None = None,
                resume: dict | None = None) -> dict[str, dict]:
    """One method: federated rounds, then (if the algorithm has one) its personalisation step.

    Returns the method's table rows: one, or one per view (FedMoE's Local, FedAvg,
    Fine-tuned and Mixture). ``checkpointer`` saves resumable checkpoints on the way;
    ``resume`` is this method's part of a checkpoint to continue from.
    """
    label = method.label
    index = config.methods.index(method)
    fed_label = row_name(method, algo.federated_view) if algo.views else label
    task = bar.add_task(fed_label, total=train.rounds, acc="-", rate="")
    earlier = resume["result"].train_seconds + resume["result"].eval_seconds if resume else 0.0
    t0 = time.perf_counter() - earlier

    on_flower = flower_grid is not None or train.executor == "flower"
    kept = client_state_keys(algo) if on_flower else []  # what a Flower resume could not re-establish

    def on_checkpoint(res: SimulationResult, phase: str = "federated") -> None:
        # on Flower the personal models live on the SuperNodes: a resume redoes personalisation instead
        if checkpointer is not None and not (on_flower and phase == "personalised"):
            checkpointer.save({"index": index, "label": label, "phase": phase, "client_keys": kept, **snapshot(res)})

    def on_eval(rnd: int, ev: Evaluation) -> None:
        _write_eval(writer, fed_label, rnd, ev)

    def on_train(rnd: int, metrics: dict[str, float]) -> None:
        writer.write(fed_label, rnd, "train", "all", metrics)

    def on_round(rnd: int, metrics, timing: dict[str, float]) -> None:
        bar.update(task, completed=rnd, **round_fields(metrics, timing, rnd))
        heartbeat.beat()

    times: dict[str, float] = {}

    def body(executor=None) -> SimulationResult:
        # resumed after its rounds (or its personalisation) the loop has nothing left to run: it only restores
        res = simulate(algo, fed, train, config.seed, executor=executor, on_round=on_round, on_eval=on_eval,
                       on_train=on_train, attack=config.attack, on_checkpoint=on_checkpoint,
                       resume=resume["result"] if resume else None, resume_states=resume["states"] if resume else None)
        bar.update(task, completed=train.rounds)
        times["federated"] = time.perf_counter() - t0
        if algo.views and not (resume is not None and resume["phase"] == "personalised"):
            ptask = bar.add_task(f"{label}:personalise", total=len(algo.personalise_clients(fed, config.seed)),
                                 acc="-", rate="clients")
            personalise(algo, fed, config.seed, res, resolve_device(train.device),
                        on_chunk=lambda done, total: (bar.update(ptask, completed=done), heartbeat.beat()))
            on_checkpoint(res, "personalised")
        return res

    if flower_grid is not None:  # deployment: this process is the Flower ServerApp
        from hetfed.flower.executor import FlowerExecutor

        result = body(FlowerExecutor(flower_grid, config, index))
    elif train.executor == "flower":
        from hetfed.flower.simulation import run_on_simulation

        result = run_on_simulation(config, index, fed.n_clients, body, log_file=run_dir / FLOWER_LOG)
    else:
        result = body()
    ckpt = run_dir / CHECKPOINTS
    ckpt.mkdir(exist_ok=True)
    save_client_states(result.states, ckpt / f"{label}-clients.pt")
    if not algo.views:
        torch.save({k: v.cpu() for k, v in result.server.params.items()}, ckpt / f"{label}-final.pt")
        if result.best_server is not None:
            torch.save({k: v.cpu() for k, v in result.best_server.params.items()}, ckpt / f"{label}-best.pt")
        summary = method_summary(result, time.perf_counter() - t0)
        summary["algorithm"] = method.algorithm
        return {label: summary}

    fed_seconds = times["federated"]
    chosen = result.best_server or result.server
    torch.save({k: v.cpu() for k, v in chosen.params.items()}, ckpt / f"{label}-global-best.pt")
    rows = {}
    for view in algo.views:
        ev = result.views[view]
        if view == algo.federated_view:
            seconds, extra = fed_seconds, {"rounds": result.rounds_done, "best_round": result.best_round,
                                           "selected_by": result.selected_by, **_failures(result)}
        else:
            epochs = result.personal_info.get(f"epochs.{view}", [0])
            seconds = float(sum(result.personal_info.get(f"seconds.{view}", [0.0])))
            extra = {"epochs": int(max(epochs)), "epochs_mean": float(np.mean(epochs))}
        name = row_name(method, view)
        _write_eval(writer, name, extra.get("rounds") or extra.get("epochs") or 0, ev)
        rows[name] = {**_view_summary(ev, seconds, extra), "algorithm": f"{method.algorithm}:{view}"}
    return rows


def save_client_states(states, path: Path) -> None:
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


def _view_summary(ev: Evaluation, seconds: float, extra: dict) -> dict:
    """A personalised view's row: one evaluation, so final = best."""
    metrics = _clean(ev.metrics)
    return {
        "final": metrics,
        "best": metrics,
        "local_accuracy": metrics.get("local_accuracy_mean"),
        "global_accuracy": metrics.get("global_accuracy"),
        "wall_seconds": seconds,
        "seconds_per_round": seconds / max(extra.get("rounds") or extra.get("epochs") or 1, 1),
        **extra,
    }


def print_summary(summary: dict, run_dir: Path, console: Console) -> None:
    """The short table that ends a run."""
    g = summary.get("gamma")
    gamma = f"{g:.3f}" if isinstance(g, float) and not np.isnan(g) else "— (one client)"
    trained = f" · {summary['training']}" if summary.get("training") else ""
    table = Table(title=f"{summary['dataset']} · {summary['partition']} · {summary['n_clients']} clients · Γ = {gamma}"
                  f"{trained}")
    binary = any("global_auc" in m["best"] for m in summary["methods"].values())
    cols = ["method", "local acc", "local p10", "global acc", "unseen acc", "final global", "s/round", "eval s"]
    if binary:
        cols[1:1] = ["local AUC", "global AUC"]  # noqa: RUF005
    for col in cols:
        table.add_column(col, justify="right")

    def fmt(v):
        return "-" if v is None else f"{v:.3f}"

    for label, m in summary["methods"].items():
        b = m["best"]
        row = [label, fmt(b.get("local_accuracy_mean")), fmt(b.get("local_accuracy_p10")), fmt(b.get("global_accuracy")),
               fmt(b.get("server_accuracy")), fmt(m["final"].get("global_accuracy")), f"{m['seconds_per_round']:.4f}",
               "-" if m.get("eval_seconds_per_evaluation") is None else f"{m['eval_seconds_per_evaluation']:.4f}"]
        if binary:
            row[1:1] = [fmt(b.get("local_auc_mean")), fmt(b.get("global_auc"))]
        table.add_row(*row)
    global_test = ("the class-balanced global test set" if summary.get("global_test_balanced", True) else
                   "the global test set (the dataset's own test split, not class-balanced)")
    table.caption = ("the headline columns (local, p10, global, unseen) score the best model by validation loss; "
                     "final global: the last round's model. local: each client's own test set, its own parameters "
                     f"(p10: the 10th-percentile client); global: {global_test}; unseen: the server's model on it, "
                     "as a client that took no part would get it (CGAU: zero conditioning; personalised methods: "
                     "the shared model without a client's own parameters; - where the server holds none); s/round: "
                     "training (server step included); eval s: one evaluation")
    console.print(table)
    from hetfed.heterogeneity import gamma_line

    if "heterogeneity" in summary:
        console.print(gamma_line(summary["heterogeneity"]), soft_wrap=True)
    for method, m in summary["methods"].items():
        if m.get("selection_note"):
            console.print(f"note ({method}): {m['selection_note']}", style="yellow", soft_wrap=True)
        if (m.get("gamma_from_summaries") or {}).get("warning"):
            console.print(f"warning ({method}): {m['gamma_from_summaries']['warning']}", style="yellow",
                          soft_wrap=True)
    console.print(f"run directory: {run_dir}  ({summary['wall_seconds']:.1f} s)", soft_wrap=True)


def client_state_keys(algo) -> list[str]:
    """What an algorithm's clients keep between rounds (CGAU's conditioning rows, SCAFFOLD's control variates,
    kept optimiser state …); empty when they keep nothing."""
    from hetfed.engine.rng import CLIENT_INIT, torch_gen

    return sorted(algo.client_init(0, torch_gen(0, CLIENT_INIT, 0)))


def check_flower_resumable(checkpoint: dict | None) -> None:
    """A Flower run's checkpoint holds the server's side only: the clients' own state lived in the SuperNodes'
    run context, which ended with the killed run. Resuming mid-rounds is exact only for a method whose clients
    keep nothing between rounds; for any other the resume is refused, saying why."""
    from hetfed.errors import RunError

    current = (checkpoint or {}).get("current")
    if not current or current["result"].rounds_done == 0:
        return
    kept = current.get("client_keys", [])
    if kept:
        shown = ", ".join(kept[:4]) + (" …" if len(kept) > 4 else "")
        raise RunError(
            f"cannot resume method {current['label']!r} on Flower after round {current['result'].rounds_done}: its "
            f"clients keep state across rounds ({shown}) in the SuperNodes' run context, which ended with the killed "
            "run, and a new run cannot re-establish it (the server never held it); rerun it from the start, or run "
            "it with train.executor vectorised, whose checkpoints hold every client's state")


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
    from hetfed.config import load_run_config
    from hetfed.errors import RunError
    from hetfed.runs.rundir import run_state

    if not (path / CONFIG).is_file():
        raise RunError(f"--resume {str(path)!r}: no config.yaml there; expected a run directory written by hetfed run")
    state = run_state(path)
    if state == "complete":
        raise RunError(f"--resume {str(path)!r}: the run is already complete (status.json); nothing to resume")
    if state == "running":
        raise RunError(f"--resume {str(path)!r}: the run is still running (its process is alive); expected a failed "
                       "or killed run")
    return load_run_config(path / CONFIG)
