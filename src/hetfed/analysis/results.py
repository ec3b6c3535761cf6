"""Reading what runs and sweeps wrote: learning curves from metrics.csv, and a sweep's figures."""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from hetfed.config import Config
from hetfed.runs.rundir import read_metric_rows
from hetfed.runs.sweep_tables import Curves

#: a run's run-level series: ``{metric: {method: [(round, value)]}}`` (:func:`run_level`)
RunCurves = dict[str, dict[str, list[tuple[int, float]]]]


def _view_pairs(config: Config | None) -> list[tuple[str, str]]:
    """(federated row, headline row) of each method that reports views (FedMoE: fedavg, mixture)."""
    if config is None:
        return []
    from hetfed.algorithms import registry
    from hetfed.runs.summary import row_name

    pairs = []
    for m in config.methods:
        caps = registry.get(m.algorithm).capabilities
        if caps.views and caps.primary_view:
            pairs.append((row_name(m, caps.federated_view), row_name(m, caps.primary_view)))
    return pairs


#: the metrics drawn against the swept keys, when the sweep has them
SWEEP_FIGURES = ("final.global_accuracy", "best.global_accuracy", "best.local_accuracy_mean", "best.local_accuracy_p10",
                 "best.server_accuracy", "best.global_auc", "best.local_auc_mean", "seconds_per_round",
                 "best.local_accuracy_opted_in_mean", "best.local_accuracy_opted_out_mean", "gamma", "gamma_excess")


#: the learning curves a sweep draws, mean over seeds
SWEEP_CURVES = ("global_accuracy", "local_accuracy_mean")


def sweep_figures(table: list[dict], grid: dict[str, list[Any]], curves: Curves, config: Config | None = None,
                  ) -> list[tuple[str, Any]]:
    """The sweep's figures as ``(file stem, draw)`` pairs; ``draw(path)`` saves, ``draw(None)`` returns the figure.

    The learning curves are the sweep's curves.csv (:func:`~hetfed.runs.sweep_tables.read_curves_table`), so a
    merged sweep whose run directories are gone draws them as the sweep did."""
    from hetfed.analysis.figures import plot_global_vs_local, plot_relative, plot_sweep

    out: list[tuple[str, Any]] = []
    for metric in SWEEP_CURVES:
        if curves.get(metric):
            out.append((f"curves_{metric}", lambda path, c=curves[metric], m=metric: _plot_curves(c, m, path)))
    rows = {r["method"] for r in table}
    for fed_row, primary in _view_pairs(config):  # a method with views (FedMoE): its figures 3 and 5
        if len(grid) == 1 and {fed_row, primary} <= rows:
            key = next(iter(grid))
            out.append(("global_vs_local", lambda path, k=key: plot_global_vs_local(table, k, path)))
            out.append((f"global_relative_to_{fed_row}", lambda path, k=key, b=fed_row: plot_relative(
                table, k, "best.global_accuracy", b, path)))
            break
    if grid:  # each metric against the swept keys (panels for the combinations of the other keys)
        for metric in SWEEP_FIGURES:
            if any(r["metric"] == metric for r in table):
                out.append((metric, lambda path, m=metric: plot_sweep(table, grid, m, path)))
    return out


def _plot_curves(curves, metric: str, path):
    from hetfed.analysis.figures import plot_mean_curves

    return plot_mean_curves(curves, metric, path)


def run_level(rows: Iterable[dict[str, Any]]) -> RunCurves:
    """``{metric: {method: [(round, value)]}}`` of metrics.csv's run-level rows (split summary or train, client
    all), from its rows as read (:func:`~hetfed.runs.rundir.read_metric_rows`, or the report's typed ones)."""
    per: dict[str, dict[str, dict[int, float]]] = {}
    for row in rows:
        if row["split"] in ("summary", "train") and row["client"] == "all":
            # first wins: FedMoE's final scoring of its federated view repeats the last round's row
            per.setdefault(row["metric"], {}).setdefault(row["method"], {}).setdefault(int(row["round"]),
                                                                                       float(row["value"]))
    return {metric: {m: sorted(points.items()) for m, points in methods.items()} for metric, methods in per.items()}


def read_curves(path: Path, metric: str) -> dict[str, list[tuple[int, float]]]:
    """``{method: [(round, value)]}`` of one run-level metric from a run's metrics.csv."""
    return run_level(read_metric_rows(path, ",all,")).get(metric, {})


#: the metrics a run's learning-curve figure draws
RUN_CURVES = ("global_accuracy", "local_accuracy_mean", "val_loss", "train_loss")


#: what a run's curves can be drawn against besides rounds (summary rows of metrics.csv), and the axis label
CURVE_AXES = {"sim_time": "simulated time (s)", "uplink_bytes_total": "uplink bytes (cumulative)"}


def run_curves_against(table: RunCurves, x_metric: str, metrics: tuple[str, ...] = ("global_accuracy",
                                                                                     "local_accuracy_mean"),
                       min_points: int = 2) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """``{metric: {method: [(x, value)]}}`` of a run's curves (:func:`run_level`): each evaluation's value against
    its ``x_metric`` (``sim_time``, ``uplink_bytes_total``) from the same summary row; methods whose x never moves
    are left out, and nothing is returned when x is the round times one constant for every method (equal clients on
    a constant clock, no compression: the round axis already says it)."""
    xs = table.get(x_metric, {})
    per_round = {x / r for points in xs.values() for r, x in points if r > 0}
    if len(per_round) <= 1 or max(per_round) - min(per_round) <= 1e-9 * max(abs(v) for v in per_round):
        return {}
    out: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for metric in metrics:
        for method, points in table.get(metric, {}).items():
            x_of = dict(xs.get(method, []))
            pairs = [(x_of[r], v) for r, v in points if r in x_of and not math.isnan(v)]
            if len(pairs) >= min_points and len({x for x, _ in pairs}) > 1:
                out.setdefault(metric, {})[method] = pairs
    return out


def defence_curves(table: RunCurves) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """What a run's defence decided, round by round, under an attack (:mod:`hetfed.server.detection`), from its curves
    (:func:`run_level`): ``{"defence.attackers_excluded" | "defence.honest_excluded": {method: [(round, share)]}}``,
    the share of the malicious (honest) updates sent that round the defence left out, and ``"defence.attack_weight"``,
    the malicious updates' share of its weight (the rounds it weighed them in). {} for a run under no attack."""
    out: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for who in ("attackers", "honest"):
        sent = table.get(f"{who}_sent", {})
        for method, points in table.get(f"{who}_excluded", {}).items():
            of = dict(sent.get(method, []))
            shares = [(r, v / of[r]) for r, v in points if of.get(r)]
            if shares:
                out.setdefault(f"defence.{who}_excluded", {})[method] = shares
    weights = {method: points for method, points in table.get("attack_weight", {}).items() if points}
    if weights:
        out["defence.attack_weight"] = weights
    return out


#: a per-client finding round by round: its rounds (columns), its clients (rows) and ``values[client, round]`` (NaN
#: where a client has none that round)
FindingGrid = tuple[list[int], list[int], np.ndarray]


def client_findings(rows: Iterable[dict[str, Any]]) -> dict[tuple[str, str], FindingGrid]:
    """What a method's server step found about each client, round by round (a per-client ``Algorithm.findings``:
    Agnostic FL's λ_k), from metrics.csv's rows as read — the ``train`` rows of one client, which nothing else
    writes: ``{(finding, method): (rounds, clients, values)}``, in the order the rows name them."""
    cells: dict[tuple[str, str], dict[tuple[int, int], float]] = {}
    for row in rows:
        if row["split"] == "train" and row["client"] != "all":
            cells.setdefault((row["metric"], row["method"]), {})[int(row["client"]), int(row["round"])] = \
                float(row["value"])
    out: dict[tuple[str, str], FindingGrid] = {}
    for (finding, method), values in cells.items():
        clients, rounds = sorted({c for c, _ in values}), sorted({r for _, r in values})
        at_client, at_round = {c: i for i, c in enumerate(clients)}, {r: j for j, r in enumerate(rounds)}
        grid = np.full((len(clients), len(rounds)), np.nan)
        for (c, r), v in values.items():
            grid[at_client[c], at_round[r]] = v
        out[finding, method] = (rounds, clients, grid)
    return out


def run_curves(table: RunCurves, min_points: int = 1) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{metric: {method: [(round, value)]}}`` of :data:`RUN_CURVES` from a run's curves (:func:`run_level`), NaN
    points dropped; methods with fewer than ``min_points`` points, and metrics left without any, are left out."""
    curves = {m: table.get(m, {}) for m in RUN_CURVES}
    curves = {m: {k: [p for p in v if not math.isnan(p[1])] for k, v in c.items()} for m, c in curves.items()}
    curves = {m: {k: v for k, v in c.items() if len(v) >= max(min_points, 1)} for m, c in curves.items()}
    return {m: c for m, c in curves.items() if c}
