"""A run's numbers as ``summary.json`` and the console hold them: one row per method (or per view of a method),
the run's summary, the final table, the progress bar's fields."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table

from hetfed.config import Config, MethodConfig
from hetfed.engine.evaluate import Evaluation
from hetfed.executors.updates import SimulationResult
from hetfed.interface import Algorithm
from hetfed.pipeline import Prepared
from hetfed.runs.rundir import environment

#: metrics shown in the final table and compared across methods
HEADLINE = ("global_accuracy", "local_accuracy_mean")

def _clean(metrics: dict[str, float]) -> dict[str, float | None]:
    """JSON-safe metrics: NaN and ±inf (ε without noise) become None."""
    return {k: (None if (isinstance(v, float) and not np.isfinite(v)) else float(v)) for k, v in metrics.items()}


def method_summary(result: SimulationResult, seconds: float) -> dict[str, Any]:
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
        **_ended(result),
        "wall_seconds": seconds,
        "seconds_per_round": result.train_seconds / max(result.rounds_done, 1),
        "server_seconds_per_round": result.server_seconds / max(result.rounds_done, 1),
        "eval_seconds": result.eval_seconds,
        "eval_seconds_per_evaluation": result.eval_seconds / max(result.evaluations, 1),
        "sim_time": result.sim_time,  # the simulated clock after the last round (train.clock)
        "uplink_bytes": result.uplink_bytes,
        "downlink_bytes": result.downlink_bytes,
        **_failures(result),
    }


def _ended(result: SimulationResult) -> dict[str, bool]:
    """How the rounds ended early: by early stopping, and (only when it did) at ``train.time_limit``."""
    return {"stopped_early": result.stopped_early, **({"stopped_at_time_limit": True} if result.out_of_time else {})}


def _failures(result: SimulationResult) -> dict[str, Any]:
    """Clients that did not answer (Flower), the round's client counts summed, rounds skipped, and ε."""
    failed = list(getattr(result.executor, "failures", []))
    out: dict[str, Any] = {"clients": dict(result.faults)} if result.faults else {}
    if failed or result.skipped_rounds:
        out.update(failed_clients=failed, skipped_rounds=list(result.skipped_rounds))
    if result.diverged_at is not None:
        out["diverged_at"] = result.diverged_at
    if result.attack_weight_rounds:  # the malicious updates' mean share of the defence's weight
        out["attack_weight"] = result.attack_weight_sum / result.attack_weight_rounds
    if result.findings:  # what the method's server step found in the last round
        out["findings"] = dict(result.findings)
    if result.client_findings:  # … and of each client: {name: [client 0's, …]}
        out["client_findings"] = dict(result.client_findings)
    if result.epsilon is not None:
        out["epsilon"] = result.epsilon if np.isfinite(result.epsilon) else None
        out["dp_rounds"] = result.dp_rounds
    if result.record_epsilon is not None:  # DP-SGD's: the largest over clients
        out["record_epsilon"] = result.record_epsilon if np.isfinite(result.record_epsilon) else None
    if result.delta is not None:
        out["delta"] = result.delta
    from_summaries = getattr(result.executor, "gamma_summaries", None)  # Flower: Γ from what the clients sent
    if from_summaries:
        out["gamma_from_summaries"] = from_summaries
    return out


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


def round_fields(metrics: dict[str, Any] | None, timing: dict[str, float], rnd: int,
                 since: tuple[int, float] | None = None) -> dict[str, str]:
    """The progress bar's fields after a round (:func:`hetfed.console.round_progress`): the global accuracy when
    the round was evaluated, the training rate over the rounds after ``since`` (an earlier round and the training
    seconds then; None: since the run's start) and the seconds spent evaluating. Why a recent rate: the run's average
    is pulled down by its first rounds (a compile, a start beside another process) long after they are over."""
    fields = {"acc": f"{metrics['global_accuracy']:.3f}"} if metrics and "global_accuracy" in metrics else {}
    start, seconds = since if since is not None and since[0] < rnd else (0, 0.0)
    fields["rate"] = f"{_rate(rnd - start, timing['train_s'] - seconds)} · eval {timing['eval_s']:.1f} s"
    return fields


def view_row(algo: Algorithm, view: str, result: SimulationResult, fed_seconds: float) -> tuple[dict[str, Any], int]:
    """A personalised method's row for one of its views, and the round (or epochs) its evaluation is filed
    under: the federated view took the rounds, the others their personalisation epochs."""
    if view == algo.capabilities.federated_view:
        seconds, extra = fed_seconds, {"rounds": result.rounds_done, "best_round": result.best_round,
                                       "selected_by": result.selected_by, **_ended(result), **_failures(result)}
    else:
        epochs = result.personal_info.get(f"epochs.{view}", [0])
        seconds = float(sum(result.personal_info.get(f"seconds.{view}", [0.0])))
        extra = {"epochs": int(max(epochs)), "epochs_mean": float(np.mean(epochs))}
    return _view_summary(result.views[view], seconds, extra), extra.get("rounds") or extra.get("epochs") or 0


def run_summary(config: Config, prep: Prepared, methods: dict[str, dict[str, Any]], started: str, resumes: int,
                wall_seconds: float) -> dict[str, Any]:
    """``summary.json``: the run's data, federation and heterogeneity, its primary method's numbers, every
    method's row, and where and when it ran."""
    fed, het = prep.federation, prep.heterogeneity
    primary = primary_row(config.methods[0])
    return {
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
        "gamma": None if np.isnan(het.gamma) else het.gamma,  # JSON has no NaN: null, not measured or undefined
        "heterogeneity": het.as_dict(),
        "data_files": list(prep.sources),
        "data_notes": list(prep.notes),  # what loading did: classes kept, roles, sizes
        "warnings": list(prep.warnings),
        "primary": primary,
        "training": training_line(config),
        "final": methods[primary]["final"],
        "best": methods[primary]["best"],
        "rounds": max(m.get("rounds") or 0 for m in methods.values()),
        "wall_seconds": wall_seconds,
        **({"resumed": resumes} if resumes else {}),
        "started": started,
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "environment": environment(),
        "methods": methods,
    }


def _view_summary(ev: Evaluation, seconds: float, extra: dict[str, Any]) -> dict[str, Any]:
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


def _summary_table(summary: dict[str, Any]) -> Table:
    """Each method's headline numbers, in a table that fits 80 columns (two-line headers, 3-digit values, no column
    that holds only dashes)."""
    g = summary.get("gamma")
    gamma = f"{g:.3f}" if isinstance(g, float) and not np.isnan(g) else "— (one client)"
    # Γ has a line of its own below the table (with its IID reference); an older summary without it: in the title
    shown_gamma = "" if "heterogeneity" in summary else f" · Γ = {gamma}"
    trained = f" · {summary['training']}" if summary.get("training") else ""
    table = Table(title=f"{summary['dataset']} · {summary['partition']} · {summary['n_clients']} clients{shown_gamma}"
                  f"{trained}", box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    binary = any("global_auc" in m["best"] for m in summary["methods"].values())

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    def short(v: float | None, scale: float = 1.0) -> str:  # sizes: 3 significant digits
        return "-" if v is None else f"{v / scale:.3g}"

    def ms(v: float | None) -> str:  # seconds as whole milliseconds (two digits below 10 ms)
        return "-" if v is None else (f"{v * 1e3:.0f}" if v >= 0.01 else f"{v * 1e3:.2g}")

    # two-line headers and 3-digit values: the table fits an 80-column terminal without cutting a number
    cols = ["method", "local\nacc", "local\np10", "global\nacc", "unseen\nacc", "final\nglobal", "ms/\nround",
            "eval\nms", "sim\ns", "up\nMB"]
    if binary:
        cols[1:1] = ["local\nAUC", "global\nAUC"]  # noqa: RUF005
    rows = []
    for label, m in summary["methods"].items():
        b = m["best"]
        row = [label, fmt(b.get("local_accuracy_mean")), fmt(b.get("local_accuracy_p10")),
               fmt(b.get("global_accuracy")),
               fmt(b.get("server_accuracy")), fmt(m["final"].get("global_accuracy")), ms(m["seconds_per_round"]),
               ms(m.get("eval_seconds_per_evaluation")), short(m.get("sim_time")),
               short(m.get("uplink_bytes"), 1e6)]
        if binary:
            row[1:1] = [fmt(b.get("local_auc_mean")), fmt(b.get("global_auc"))]
        rows.append(row)
    shown = [j for j in range(len(cols)) if j == 0 or any(r[j] != "-" for r in rows)]  # a column of dashes says nothing
    for j in shown:
        table.add_column(cols[j], justify="left" if j == 0 else "right", no_wrap=True)
    for row in rows:
        table.add_row(*(row[j] for j in shown))
    global_test = ("the class-balanced global test set" if summary.get("global_test_balanced", True) else
                   "the global test set (the dataset's own test split, not class-balanced)")
    table.caption = ("the headline columns (local, p10, global, unseen) score the best model by validation loss; "
                     "final global: the last round's model. local: each client's own test set, its own parameters "
                     f"(p10: the 10th-percentile client); global: {global_test}; unseen: the server's model on it, "
                     "as a client that took no part would get it (CGAU: zero conditioning; personalised methods: "
                     "the shared model without a client's own parameters; - where the server holds none); ms/round: "
                     "training (server step included); eval ms: one evaluation; sim s: the simulated clock at the "
                     "end (train.clock); up MB: what the clients sent (server.compression)")
    return table


def defence_line(method: str, m: dict[str, Any]) -> str | None:
    """Under an attack, what the method's defence decided over the attacked rounds (:mod:`hetfed.server.detection`):
    the malicious and honest updates it left out, and the malicious ones' mean share of its weight; None where it
    decided none (no attack, or a rule that weighs no update)."""
    c = m.get("clients") or {}
    if not c.get("attackers_sent"):
        return None
    weight = m.get("attack_weight")
    share = f"; the malicious ones got {weight:.1%} of its weight" if weight is not None else ""
    return (f"defence ({method}): left out {c['attackers_excluded']} of {c['attackers_sent']} malicious updates and "
            f"{c['honest_excluded']} of {c['honest_sent']} honest ones{share}")


def findings_line(method: str, m: dict[str, Any]) -> str | None:
    """What the method's server step found in the last round (``findings``): a clustered method's clusters and,
    under concept shift, how they match the clients' concepts (the adjusted Rand index), then any other number
    (Agnostic FL's λ, CFL's update norms); None when it found nothing."""
    found = dict(m.get("findings") or {})
    if not found:
        return None
    parts = []
    if "clusters" in found:
        ari = found.pop("cluster_ari", None)
        match = "" if ari is None else f", adjusted Rand index against the clients' concepts {ari:.2f} (1: exactly)"
        k = int(found.pop("clusters"))
        parts.append(f"clients in {k} cluster{'s' if k != 1 else ''}{match}")
    parts.extend(f"{key} {value:.4g}" for key, value in found.items())
    return f"found ({method}), the last round: " + "; ".join(parts)


def privacy_line(method: str, m: dict[str, Any]) -> str | None:
    """The method's differential-privacy guarantee after its rounds (``privacy.*``): client level (DP-FedAvg's noised
    mean) and record level (DP-SGD's, its worst client), at ``privacy.delta``; None without DP. It was in summary.json
    and the sweep's tables only: a run's own end said nothing of it."""
    def eps(value: float | None) -> str:
        return "∞ (no guarantee)" if value is None else f"{value:.4g}"

    parts = []
    if "epsilon" in m:
        parts.append(f"client-level ε = {eps(m['epsilon'])} after {m.get('dp_rounds', 0)} noised rounds")
    if "record_epsilon" in m:
        parts.append(f"record-level (DP-SGD, its worst client) ε = {eps(m['record_epsilon'])}")
    if not parts:
        return None
    at = f", at δ = {m['delta']:g}" if m.get("delta") is not None else ""
    return f"privacy ({method}): " + "; ".join(parts) + at


def stop_line(method: str, m: dict[str, Any]) -> str | None:
    """Why a method's rounds ended before ``train.rounds``: early stopping or the time limit; None when they ran."""
    if m.get("stopped_at_time_limit"):
        why = "its rounds reached train.time_limit"
    elif m.get("stopped_early"):
        why = "its validation loss did not improve for train.patience evaluations"
    else:
        return None
    return f"stopped ({method}) after {m['rounds']} round{'s' if m['rounds'] != 1 else ''}: {why}"


def print_summary(summary: dict[str, Any], run_dir: Path, console: Console) -> None:
    """The short table that ends a run."""
    console.print(_summary_table(summary))
    from hetfed.heterogeneity import gamma_given_label_line, gamma_line

    if "heterogeneity" in summary:  # one line, or on a narrow terminal one line per figure (no figure split)
        for line in (gamma_line(summary["heterogeneity"]), gamma_given_label_line(summary["heterogeneity"])):
            for part in [] if line is None else [line] if len(line) <= console.width else line.split("   "):
                console.print(part, soft_wrap=True)
    for method, m in summary["methods"].items():
        for line in (stop_line(method, m), privacy_line(method, m), defence_line(method, m), findings_line(method, m)):
            if line is not None:
                console.print(line, soft_wrap=True)
        if m.get("selection_note"):
            console.print(f"note ({method}): {m['selection_note']}", style="yellow", soft_wrap=True)
        if (m.get("gamma_from_summaries") or {}).get("warning"):
            console.print(f"warning ({method}): {m['gamma_from_summaries']['warning']}", style="yellow",
                          soft_wrap=True)
    console.print(f"run directory: {run_dir}  ({summary['wall_seconds']:.1f} s)", soft_wrap=True)


