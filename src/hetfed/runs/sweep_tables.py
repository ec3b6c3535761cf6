"""A sweep's tables: what each run contributes (``runs.csv``, one value per seed), the aggregate over seeds with
95% CIs (``sweep.csv``, ``heterogeneity.csv``), the learning curves (``curves.csv``), and the console's table. Read
back by ``hetfed merge``, the report and the figures, so they live apart from the driver that runs the sweep."""

from __future__ import annotations

import csv
import hashlib
import json
import math
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from hetfed.runs.rundir import METRICS, read_metric_rows

#: the metrics aggregated per method (final and best-by-validation)
AGGREGATED = ("global_accuracy", "local_accuracy_mean", "local_accuracy_weighted", "local_accuracy_worst10",
              "local_accuracy_std", "local_accuracy_p10", "global_auc", "local_auc_mean", "server_accuracy",
              "local_accuracy_opted_in_mean", "local_accuracy_opted_out_mean", "global_accuracy_own",
              "global_accuracy_other", "gate_own", "gate_other", "backdoor_accuracy",
              "local_backdoor_accuracy_mean", "val_loss", "val_accuracy")

#: what the server learnt (``leakage.kind``), shown beside the accuracy where a sweep attacked
LEAKED = ("leakage.global_auc", "leakage.personal_auc", "leakage.personal_tpr_at_1pct_fpr", "leakage.psnr",
          "leakage.labels_recovered")
#: what the server's defence decided under an attack (:func:`defence_rates`), shown beside the accuracy
DEFENDED = ("defence.attackers_excluded", "defence.honest_excluded", "defence.attack_weight")


def value_key(value: Any) -> str:
    """A hashable, stable, compact spelling of a grid value (lists and dicts included)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


#: fewer seeds than this get no confidence interval anywhere — the console table, sweep.csv, report.html and
#: the figures: Student t on one degree of freedom (n = 2) makes the 95% CI 12.7 × the standard error
MIN_SEEDS_FOR_CI = 3


def ci95(values: list[float]) -> float:
    """Half-width of the 95% confidence interval of the mean over seeds (Student t); NaN with fewer than
    :data:`MIN_SEEDS_FOR_CI` finite values (no interval, not a zero-width one)."""
    from hetfed.engine.summary import ci95_over

    finite = [v for v in values if v is not None and not math.isnan(v)]
    return ci95_over(finite) if len(finite) >= MIN_SEEDS_FOR_CI else math.nan


def mean_ci_text(mean: float, ci: float) -> str:
    """``0.8123 ± 0.0100``, or ``0.8123 ± –`` where there is no CI (too few seeds)."""
    return f"{mean:.4f} ± {ci:.4f}" if not math.isnan(ci) else f"{mean:.4f} ± –"


def point_name(point: dict[str, Any]) -> str:
    """The name of a grid point, its folder's where that fits (:func:`point_dir`): no path separators, whatever the
    values."""
    return ",".join(f"{k}={value_key(v)}" for k, v in point.items()).replace("/", "%2F") or "base"


#: the longest name a folder may have (bytes; Linux's and macOS's file systems)
NAME_MAX = 255


def point_dir(point: dict[str, Any]) -> str:
    """The folder of a grid point: its name, or where that is longer than a folder's name may be — a grid over
    methods written out in full, ``methods=[{…}]`` — its first bytes and a digest of the whole (it failed with
    "File name too long" after the sweep's folder was made). Names that fit are kept, so a sweep made before
    resumes in its own folders."""
    name = point_name(point)
    raw = name.encode()
    if len(raw) <= NAME_MAX:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:16]
    return raw[:NAME_MAX - len(digest) - 1].decode(errors="ignore") + "~" + digest


def shown_point(point: dict[str, Any], method: str | None = None) -> dict[str, Any]:
    """A run's grid point as progress lines and reports name it: with its method where it trains one of the point's
    (``--each-method``)."""
    return point if method is None else {**point, "method": method}


def method_dir(label: str) -> str:
    """The folder, within its seed's, of a run that trains one of a point's methods (``hetfed sweep
    --each-method``): ``method=<label>``, named as a grid point's is."""
    return point_dir(shown_point({}, label))


def write_heterogeneity(path: Path, rows: list[dict[str, Any]], keys: list[str]) -> None:
    """Table 1 of the CGAU paper: Γ (and label skew) per grid point, mean ± 95% CI."""
    cols = [*keys, "metric", "mean", "ci95", "n"]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for row in rows:
            if row["method"] == "(data)":
                w.writerow({c: row[c] for c in cols})


def run_values(summary: dict[str, Any]) -> Iterator[tuple[str, str, Any]]:
    """Every (method, metric, value) one run contributes to a sweep's tables: Γ as method ``(data)``, and per
    method ``final.<metric>`` / ``best.<metric>`` (the last round's model / the one chosen by validation),
    ``rounds`` (fewer than ``train.rounds`` where early stopping or the time limit ended it), ``best_round`` and the
    timings."""
    if summary["gamma"] is not None and not math.isnan(summary["gamma"]):  # not measured: heterogeneity.gamma
        yield "(data)", "gamma", summary["gamma"]
    for key in ("gamma_iid", "gamma_excess", "gamma_given_label", "gamma_given_label_excess"):  # older runs: none
        value = summary["heterogeneity"].get(key)
        if value is not None and not math.isnan(value):
            yield "(data)", key, value
    yield "(data)", "label_emd_mean", summary["heterogeneity"]["label_emd_mean"]
    for label, m in summary["methods"].items():
        for when in ("final", "best"):
            for metric in AGGREGATED:
                value = m[when].get(metric)
                if value is not None:
                    yield label, f"{when}.{metric}", value
        for key in ("epsilon", "record_epsilon"):  # the DP guarantees (client level; record level, worst client)
            if m.get(key) is not None:
                yield label, key, m[key]
        yield from ((label, key, value) for key, value in defence_rates(m).items())
        yield from ((label, f"findings.{key}", value) for key, value in (m.get("findings") or {}).items())
        for key, value in (m.get("leakage") or {}).items():  # what the server learnt (leakage.kind)
            if isinstance(value, (int, float)) and key not in ("client", "round"):
                yield label, f"leakage.{key}", value
        if m.get("rounds") is not None:  # the rounds it ran: fewer than train.rounds when it stopped early
            yield label, "rounds", m["rounds"]
        if m.get("best_round") is not None:
            yield label, "best_round", m["best_round"]
        yield label, "seconds_per_round", m["seconds_per_round"]
        if m.get("server_seconds_per_round") is not None:
            yield label, "server_seconds_per_round", m["server_seconds_per_round"]


def defence_rates(method: dict[str, Any]) -> dict[str, float]:
    """What a defence decided over a run's attacked rounds (:mod:`hetfed.server.detection`), from a method's summary:
    the shares of the malicious and of the honest updates it left out (its true and false positive rates, from the
    client counts) and the malicious updates' mean share of its weight; none where the run was not attacked or its
    combine rule weighs no update."""
    clients = method.get("clients") or {}
    out = {}
    for who in ("attackers", "honest"):
        if clients.get(f"{who}_sent"):
            out[f"defence.{who}_excluded"] = clients[f"{who}_excluded"] / clients[f"{who}_sent"]
    if method.get("attack_weight") is not None:
        out["defence.attack_weight"] = method["attack_weight"]
    return out


def aggregate(summaries: list[tuple[dict[str, Any], int, dict[str, Any]]], keys: list[str]) -> list[dict[str, Any]]:
    """Mean ± 95% CI over seeds, per grid point × method × metric."""
    return aggregate_values(((tuple(cell(point[k]) for k in keys), method, metric, value)
                             for point, _seed, summary in summaries
                             for method, metric, value in run_values(summary)), keys)


def aggregate_values(values: Iterable[tuple[tuple[Any, ...], str, str, float]],
                     keys: list[str]) -> list[dict[str, Any]]:
    """Mean ± 95% CI over seeds of ``(grid point cells, method, metric, one run's value)`` items, per grid point ×
    method × metric, in the order first seen — what :func:`aggregate` computes from run summaries, and
    ``hetfed merge`` from the runs.csv of sweeps whose run directories are gone."""
    groups: dict[tuple[Any, ...], dict[str, list[float]]] = {}
    for pkey, method, metric, value in values:
        groups.setdefault((pkey, method), {}).setdefault(metric, []).append(value)
    rows = []
    for (pkey, method), metrics in groups.items():
        for metric, vals in metrics.items():
            row = dict(zip(keys, pkey, strict=True))
            row.update(method=method, metric=metric, mean=float(np.mean(vals)), ci95=ci95(vals), n=len(vals),
                       min=float(np.min(vals)), max=float(np.max(vals)))
            rows.append(row)
    return rows


def write_runs(path: Path, summaries: list[tuple[dict[str, Any], int, dict[str, Any]]], keys: list[str]) -> None:
    """runs.csv: one row per grid point × seed × method × metric with the run's own value — what paired
    comparisons (:mod:`hetfed.analysis.paired`) and the reproduction table are computed from, and small enough
    to keep in ``results/`` where the run directories are not."""
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*keys, "seed", "method", "metric", "value"])
        for point, seed, summary in summaries:
            cells = [cell(point[k]) for k in keys]
            for method, metric, value in run_values(summary):
                w.writerow([*cells, seed, method, metric, repr(float(value))])


#: the per-round series curves.csv keeps (the rest stay in each run's metrics.csv)
CURVES = ("global_accuracy", "local_accuracy_mean", "val_loss", "server_accuracy", "global_auc", "local_auc_mean")


def write_curves(path: Path, runs: list[tuple[dict[str, Any], int, Path]], keys: list[str]) -> None:
    """curves.csv: every run's round-by-round evaluation (grid keys, seed, method, round, metric, value) for
    :data:`CURVES` — learning curves per seed, small enough to keep where the run directories are not (which
    round a paper reports matters when a curve oscillates). The sweep's figures and report read them from here
    (:func:`read_curves_table`), each run's metrics.csv read once."""
    with open(path, "w", newline="") as out:
        w = csv.writer(out)
        w.writerow([*keys, "seed", "method", "round", "metric", "value"])
        for point, seed, run_dir in runs:
            cells = [cell(point[k]) for k in keys]
            metrics = Path(run_dir) / METRICS
            if not metrics.is_file():
                continue
            w.writerows([*cells, seed, row["method"], row["round"], row["metric"], row["value"]]
                        for row in read_metric_rows(metrics, ",summary,")
                        if row["split"] == "summary" and row["metric"] in CURVES)


#: ``{metric: {method: {grid point: [each seed's [(round, value)]]}}}``: the learning curves a sweep draws
Curves = dict[str, dict[str, dict[str, list[list[tuple[int, float]]]]]]


def read_curves_table(path: Path) -> Curves:
    """curves.csv (:func:`write_curves`, or ``hetfed merge``'s concatenation) as each seed's curve of each metric,
    method and grid point; a curve of one point is left out, and a round met twice keeps its first value (FedMoE's
    final scoring of its federated view repeats the last round's row). Empty when the file is not there."""
    if not Path(path).is_file():
        return {}
    with open(path, newline="") as fh:
        rows = csv.reader(fh)
        header = next(rows, [])
        n = header.index("seed") if "seed" in header else 0
        keys = header[:n]
        runs: dict[tuple[str, str, str, str], dict[int, float]] = {}
        for r in rows:  # keys…, seed, method, round, metric, value
            point = point_name(dict(zip(keys, r[:n], strict=True)))
            runs.setdefault((r[n + 3], r[n + 1], point, r[n]), {}).setdefault(int(r[n + 2]), float(r[n + 4]))
    out: Curves = {}
    for (metric, method, point, _seed), curve in runs.items():
        if len(curve) > 1:
            out.setdefault(metric, {}).setdefault(method, {}).setdefault(point, []).append(sorted(curve.items()))
    return out


def cell(value: Any) -> Any:
    """A grid value as a table cell: scalars as they are, lists and dicts as compact JSON."""
    return value if value is None or isinstance(value, str | int | float | bool) else value_key(value)


def write_table(path: Path, rows: list[dict[str, Any]], keys: list[str]) -> None:
    cols = [*keys, "method", "metric", "mean", "ci95", "n"]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for row in rows:
            w.writerow({c: row[c] for c in cols})


#: the metrics a sweep's printed table shows (sweep.csv holds them all)
PRINTED = ("gamma", "gamma_iid", "gamma_excess", "final.global_accuracy", "best.global_accuracy",
           "best.local_accuracy_mean", "best.server_accuracy", "best.global_auc", "best.local_auc_mean", *LEAKED,
           *DEFENDED)


def print_table(rows: list[dict[str, Any]], keys: list[str], console: Console, rounds: bool = False) -> None:
    """The sweep's table of :data:`PRINTED` metrics (``rounds``: and the rounds each method ran)."""
    metrics = (*PRINTED, "rounds") if rounds else PRINTED
    table = Table(title=f"sweep: mean ± 95% CI over seeds (Student t; – below {MIN_SEEDS_FOR_CI} seeds)")
    for col in [*keys, "method", "metric", "mean ± CI", "n"]:
        table.add_column(col, justify="right")
    for row in rows:
        if row["metric"] in metrics:
            table.add_row(*[str(row[k]) for k in keys], row["method"], row["metric"],
                          mean_ci_text(row["mean"], row["ci95"]), str(row["n"]))
    console.print(table)


#: what a grid point is chosen by for each method (:func:`tuned`): the clients' validation loss of its best model
TUNED_BY = "best.val_loss"
#: what the chosen points are shown with (the console, the report)
TUNED_SHOWN = ("best.global_accuracy", "best.local_accuracy_mean")


#: the grid keys that are a method's own settings, to be chosen (:func:`tuned_over`): its optimiser and local
#: schedule, its model, the server's optimiser, and anything under ``methods``
CHOSEN = ("train.optimizer", "train.local_epochs", "train.local_steps", "train.batch_size", "train.lr_decay",
          "model", "server.optimizer", "methods")


def tuned_over(keys: list[str]) -> list[str]:
    """The grid keys a method's setting may be chosen over: its own settings (:data:`CHOSEN`). Any other key defines
    another task or scenario — the data, the partition, an attack, a privacy budget, the rounds or the clients a
    round takes —, whose validation loss is not comparable (the weakest attack, the loosest ε would be "chosen"): a
    choice is made within each of its values."""
    return [k for k in keys if any(k == c or k.startswith(f"{c}.") for c in CHOSEN)]


def task_keys(keys: list[str]) -> list[str]:
    """The grid keys of the task or scenario (those :func:`tuned_over` leaves): a choice is made within each of their
    values."""
    over = tuned_over(keys)
    return [k for k in keys if k not in over]


def _lower_is_better(by: str) -> bool:
    """What a choice by ``by`` keeps: the lowest of a loss, the highest of anything else."""
    return "loss" in by.rsplit(".", 1)[-1]


def _choosable(rows: Iterable[dict[str, Any]], keys: list[str]) -> bool:
    """Whether ``rows`` (aggregated, or runs.csv's) give some method two or more values of the keys a choice is made
    over within one task: a grid over methods each named once (``--grid "methods=[…],[…]"``) gives each one point,
    and a table of each at its "chosen" point would repeat the sweep's."""
    over, held = tuned_over(keys), task_keys(keys)
    points: dict[tuple[Any, ...], set[tuple[Any, ...]]] = {}
    for r in rows:
        if r["method"] != "(data)":
            points.setdefault((r["method"], *(r[k] for k in held)), set()).add(tuple(r[k] for k in over))
    return any(len(values) >= 2 for values in points.values())


def check_choice(keys: list[str], rows: list[dict[str, Any]], metrics: Iterable[str]) -> None:
    """Refuse (one line) a choice a sweep cannot make: a grid with no setting of a method's own, or a metric its
    aggregated ``rows`` do not hold."""
    from hetfed.errors import ConfigError

    if not tuned_over(keys):
        raise ConfigError(f"this sweep's grid ({', '.join(keys) or 'none'}) holds no setting to choose: expected a "
                          "grid over one of a method's own settings (its optimiser or local schedule, model, server "
                          "optimiser or methods.*; e.g. train.optimizer.lr)")
    check_metrics(metrics, {r["metric"] for r in rows})


def check_metrics(metrics: Iterable[str], known: Iterable[str]) -> None:
    """Refuse (one line) a metric a sweep's tables do not hold, naming those they do."""
    from hetfed.errors import ConfigError

    held = sorted(set(known))
    for metric in metrics:
        if metric not in held:
            raise ConfigError(f"metric {metric!r} is not in this sweep: expected one of {held}")


def tuned(rows: list[dict[str, Any]], keys: list[str], by: str = TUNED_BY
          ) -> dict[tuple[str, tuple[Any, ...]], tuple[Any, ...]]:
    """Each method's grid point with the best mean over seeds of ``by`` — the lowest for a loss, else the highest;
    the first such point in the table's order on a tie — among the points that differ only in :func:`tuned_over`'s
    keys: ``(method, the other keys' cells) → the chosen point's cells`` (in ``keys``' order), from a sweep's
    aggregated rows (:func:`aggregate_values`). Why: comparing methods at one shared setting favours the method it
    suits, and choosing each one's setting by its test accuracy reports the luck of the pick; chosen on validation,
    the test metrics at the chosen point compare the methods honestly. A method with no finite ``by`` has no entry."""
    lower = _lower_is_better(by)
    held = task_keys(keys)
    best: dict[tuple[str, tuple[Any, ...]], tuple[float, tuple[Any, ...]]] = {}
    for row in rows:
        value = row["mean"]
        if row["metric"] != by or row["method"] == "(data)" or value is None or not math.isfinite(value):
            continue
        group = (row["method"], tuple(row[k] for k in held))
        kept = best.get(group)
        if kept is None or (value < kept[0] if lower else value > kept[0]):
            best[group] = (value, tuple(row[k] for k in keys))
    return {group: point for group, (_value, point) in best.items()}


def tuned_rows(rows: list[dict[str, Any]], keys: list[str], by: str = TUNED_BY,
               shown: Iterable[str] = TUNED_SHOWN) -> list[dict[str, Any]]:
    """One row per method (and value of the keys it is not chosen over) at its :func:`tuned` point: the point, ``by``'s
    mean, and each ``shown`` metric's aggregated row there (None where the method has none); none when the grid holds
    nothing to choose among (no key that leaves the data alone, or one value of those)."""
    if not _choosable(rows, keys):
        return []
    cell_of = {(tuple(r[k] for k in keys), r["method"], r["metric"]): r for r in rows}
    return [{"method": method, "point": dict(zip(keys, point, strict=True)), "by": cell_of[(point, method, by)]["mean"],
             **{metric: cell_of.get((point, method, metric)) for metric in shown}}
            for (method, _held), point in tuned(rows, keys, by).items()]


def tuned_held_out(values: Iterable[dict[str, Any]], keys: list[str], by: str = TUNED_BY,
                   metrics: Iterable[str] = TUNED_SHOWN) -> list[dict[str, Any]]:
    """Each method's test ``metrics`` with no seed's number taken at a point chosen on that seed (leave one seed out):
    for every seed, the point with the best mean of ``by`` over the *other* seeds (chosen as :func:`tuned` chooses
    over all of them) and that seed's metrics there. Why: :func:`tuned` chooses on the mean over the very seeds
    whose test metrics it reports, and a seed's validation and test scores share its federation and initialisation,
    so the pick favours them; held out, none of the numbers comes from a choice it took part in (no run is added).
    ``values``: runs.csv's rows (the grid's cells, seed, method, metric, value). One row per method and value of the
    keys it is not chosen over: each metric's mean, 95% CI and seeds, and how often each point was chosen
    (``chosen``, named by the keys chosen over); none with fewer than two seeds, or one point to choose."""
    lower, over, held = _lower_is_better(by), tuned_over(keys), task_keys(keys)
    metrics, values = list(metrics), list(values)
    if not _choosable(values, keys):
        return []
    found: dict[tuple[str, tuple[Any, ...]], dict[tuple[Any, ...], dict[Any, dict[str, float]]]] = {}
    for v in values:  # (method, held cells) → point → seed → metric → value
        if v["method"] != "(data)":
            group = found.setdefault((v["method"], tuple(v[k] for k in held)), {})
            group.setdefault(tuple(v[k] for k in keys), {}).setdefault(v["seed"], {})[v["metric"]] = float(v["value"])
    out = []
    for (method, cells), points in found.items():
        seeds = sorted({seed for per_seed in points.values() for seed in per_seed})
        picked: list[str] = []
        shown: dict[str, list[float]] = {m: [] for m in metrics}
        for seed in seeds if len(seeds) >= 2 else []:
            scores = {point: float(np.mean(others)) for point, per_seed in points.items()
                      if (others := [x[by] for s, x in per_seed.items()
                                     if s != seed and math.isfinite(x.get(by, math.nan))])}
            if not scores:
                continue
            point = (min if lower else max)(scores, key=scores.__getitem__)  # the first on a tie, as tuned
            picked.append(point_name({k: c for k, c in zip(keys, point, strict=True) if k in over}))
            for m in metrics:
                value = points[point].get(seed, {}).get(m, math.nan)
                shown[m] += [value] if math.isfinite(value) else []
        if picked:
            out.append({"method": method, **dict(zip(held, cells, strict=True)),
                        "chosen": {p: picked.count(p) for p in dict.fromkeys(picked)},
                        **{m: {"metric": m, "mean": float(np.mean(v)) if v else None, "ci95": ci95(v), "n": len(v)}
                           for m, v in shown.items()}})
    return out


def print_tuned(rows: list[dict[str, Any]], keys: list[str], console: Console) -> None:
    """Below a sweep's table, where its grid holds settings to choose among: each method at the point its validation
    loss chose (:func:`tuned_rows`)."""
    chosen = tuned_rows(rows, keys)
    if not chosen:
        return
    table = Table(title=f"each method at the {', '.join(tuned_over(keys))} its validation chose (lowest mean "
                        f"{TUNED_BY} over seeds; the test metrics there)")
    for col in ["method", *keys, TUNED_BY, *TUNED_SHOWN]:
        table.add_column(col, justify="right")
    for row in chosen:
        shown = [mean_ci_text(r["mean"], r["ci95"]) if r is not None else "-" for r in (row[m] for m in TUNED_SHOWN)]
        table.add_row(row["method"], *[str(row["point"][k]) for k in keys], f"{row['by']:.4f}", *shown)
    console.print(table)
