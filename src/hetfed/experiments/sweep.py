"""``hetfed sweep``: a grid of config values × seeds, aggregated with 95% CIs.

Every grid point × seed is a full run directory under the sweep directory
(``<key>=<value>,…/seed=<s>``). Points that differ only in the seed share a
partition kind but not a split (the seed changes the split, as it should for an
honest estimate of variance). The aggregate ``sweep.csv`` has one row per grid
point × method × metric: mean, 95% CI half-width (Student t), n. Γ per grid
point is aggregated as method ``(data)``.
"""

from __future__ import annotations

import csv
import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from rich.console import Console
from rich.table import Table

from hetfed.config import Config, build_config
from hetfed.errors import ConfigError, HetfedError, RunError
from hetfed.experiments.rundir import new_run_dir, write_json_atomic

#: the metrics aggregated per method (final and best-by-validation)
AGGREGATED = ("global_accuracy", "local_accuracy_mean", "local_accuracy_p10", "global_auc", "local_auc_mean", "server_accuracy",
              "local_accuracy_opted_in_mean", "local_accuracy_opted_out_mean")


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """``["a.b=1,2", "c=x,y"]`` → ``{"a.b": [1, 2], "c": ["x", "y"]}`` (values parsed as YAML)."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        if "=" not in item:
            raise ConfigError(f"--grid {item!r} is not allowed: expected key=v1,v2,… e.g. partition.shuffle=0,0.5,1")
        key, raw = item.split("=", 1)
        values = [yaml.safe_load(v) for v in raw.split(",") if v.strip() != ""]
        if not key or not values:
            raise ConfigError(f"--grid {item!r} is not allowed: expected key=v1,v2,…")
        grid[key.strip()] = values
    return grid


def ci95(values: list[float]) -> float:
    """Half-width of the 95% confidence interval of the mean (Student t)."""
    from scipy import stats

    v = np.asarray([x for x in values if x is not None and not math.isnan(x)], dtype=float)
    if len(v) < 2:
        return 0.0
    return float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))


def _point_name(point: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in point.items()) or "base"


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
) -> tuple[Path, list[dict]]:
    """Run every grid point × seed; write sweep.csv / sweep.json and figures; return the table.

    With ``resume``, ``out`` may hold an earlier run of this sweep: a completed run
    directory whose resolved config matches is reused; an incomplete one is moved
    aside (``<dir>.incomplete-<n>``, never deleted) and run again.
    """
    from hetfed.experiments.runner import run_experiment

    console = console or Console()
    if seeds < 1:
        raise ConfigError(f"--seeds {seeds} is not allowed: expected ≥ 1")
    points = grid_points(grid)
    base = config.model_dump(mode="json")
    # validate every point before running anything
    configs = []
    for point in points:
        for s in range(seeds):
            cfg = build_config(base, {**point, "seed": config.seed + s})
            configs.append((point, s, cfg))
    if resume and out is None:
        raise ConfigError("--resume needs --out: the directory of the sweep to resume")
    if resume and Path(out).is_dir():
        sweep_dir = Path(out)
    else:
        sweep_dir = new_run_dir(out, config.out_dir, f"{config.name}-sweep")
    total = len(configs)
    summaries: list[tuple[dict, int, dict]] = []
    run_dirs: list[tuple[dict, Path]] = []
    failed: list[dict] = []
    for i, (point, _s, cfg) in enumerate(configs, start=1):
        if progress:
            console.print(f"[{i}/{total}] {_point_name(point)} seed={cfg.seed}")
        run_dir = sweep_dir / _point_name(point) / f"seed={cfg.seed}"
        if resume and run_dir.exists():
            reused = _completed(run_dir, cfg)
            if reused is not None:
                summaries.append((point, cfg.seed, reused))
                run_dirs.append((point, run_dir))
                continue
            _move_aside(run_dir)
        try:
            res = run_experiment(cfg, out=run_dir, progress=False, console=console)
        except HetfedError as err:  # one impossible point must not lose the rest of the grid
            console.print(f"[red]failed[/] {_point_name(point)} seed={cfg.seed}: {err}")
            failed.append({"point": point, "seed": cfg.seed, "error": str(err)})
            continue
        summaries.append((point, cfg.seed, res.summary))
        run_dirs.append((point, res.run_dir))
    table = aggregate(summaries, list(grid))
    _write_heterogeneity(sweep_dir / "heterogeneity.csv", table, list(grid))
    _write_curves(run_dirs, sweep_dir / "figures")
    _write_table(sweep_dir / "sweep.csv", table, list(grid))
    write_json_atomic(sweep_dir / "sweep.json", {"grid": grid, "seeds": seeds, "rows": table, "failed": failed})
    if len(grid) == 1:
        from hetfed.experiments.figures import plot_global_vs_local, plot_relative, plot_sweep

        key = next(iter(grid))
        methods = {r["method"] for r in table}
        if {"fedavg", "mixture"} <= methods:  # FedMoE's figures 3 and 5
            plot_global_vs_local(table, key, sweep_dir / "figures" / "global_vs_local.png")
            plot_relative(table, key, "best.global_accuracy", "fedavg", sweep_dir / "figures" / "global_relative_to_fedavg.png")
        for metric in ("final.global_accuracy", "best.global_accuracy", "best.local_accuracy_mean",
                       "best.server_accuracy", "best.global_auc", "best.local_auc_mean", "seconds_per_round",
                       "best.local_accuracy_opted_in_mean", "best.local_accuracy_opted_out_mean"):
            if any(r["metric"] == metric for r in table):
                plot_sweep(table, key, metric, sweep_dir / "figures" / f"{metric}.png")
    print_table(table, list(grid), console)
    if failed:
        console.print(f"[red]{len(failed)} of {total} runs failed[/] (listed in sweep.json)")
    console.print(f"sweep directory: {sweep_dir}")
    if not summaries:
        raise RunError(f"every run of the sweep failed; see {sweep_dir / 'sweep.json'}")
    return sweep_dir, table


def _completed(run_dir: Path, cfg: Config) -> dict | None:
    """The summary of a completed run made with exactly this config, else None."""
    import json

    from hetfed.config import dump_config

    summary, config = run_dir / "summary.json", run_dir / "config.yaml"
    if summary.is_file() and config.is_file() and config.read_text() == dump_config(cfg):
        return json.loads(summary.read_text())
    return None


def _move_aside(run_dir: Path) -> Path:
    i = 1
    while (target := run_dir.with_name(f"{run_dir.name}.incomplete-{i}")).exists():
        i += 1
    run_dir.rename(target)
    return target


def _write_heterogeneity(path: Path, rows: list[dict], keys: list[str]) -> None:
    """Table 1 of the CGAU paper: Γ (and label skew) per grid point, mean ± 95% CI."""
    cols = [*keys, "metric", "mean", "ci95", "n"]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for row in rows:
            if row["method"] == "(data)":
                w.writerow({c: row[c] for c in cols})


def _write_curves(run_dirs: list[tuple[dict, Path]], fig_dir: Path) -> None:
    """Mean learning curves over seeds, one line per grid point × method."""
    from hetfed.experiments.figures import plot_mean_curves

    for metric in ("global_accuracy", "local_accuracy_mean"):
        curves: dict[str, list[list[tuple[int, float]]]] = {}
        for point, run_dir in run_dirs:
            per_method: dict[str, list[tuple[int, float]]] = {}
            with open(run_dir / "metrics.csv", newline="") as fh:
                for row in csv.DictReader(fh):
                    if row["split"] == "summary" and row["metric"] == metric:
                        per_method.setdefault(row["method"], []).append((int(row["round"]), float(row["value"])))
            for method, points in per_method.items():
                if len(points) > 1:
                    curves.setdefault(f"{_point_name(point)} · {method}", []).append(points)
        if curves:
            plot_mean_curves(curves, metric, fig_dir / f"curves_{metric}.png")


def aggregate(summaries: list[tuple[dict, int, dict]], keys: list[str]) -> list[dict]:
    """Mean ± 95% CI over seeds, per grid point × method × metric."""
    groups: dict[tuple, dict[str, list[float]]] = {}
    for point, _seed, summary in summaries:
        pkey = tuple(point[k] for k in keys)
        data = groups.setdefault((pkey, "(data)"), {})
        data.setdefault("gamma", []).append(summary["gamma"])
        data.setdefault("label_emd_mean", []).append(summary["heterogeneity"]["label_emd_mean"])
        for label, m in summary["methods"].items():
            bucket = groups.setdefault((pkey, label), {})
            for when in ("final", "best"):
                for metric in AGGREGATED:
                    value = m[when].get(metric)
                    if value is not None:
                        bucket.setdefault(f"{when}.{metric}", []).append(value)
            bucket.setdefault("seconds_per_round", []).append(m["seconds_per_round"])
            if m.get("server_seconds_per_round") is not None:
                bucket.setdefault("server_seconds_per_round", []).append(m["server_seconds_per_round"])
    rows = []
    for (pkey, method), metrics in groups.items():
        for metric, values in metrics.items():
            row = dict(zip(keys, pkey, strict=True))
            row.update(method=method, metric=metric, mean=float(np.mean(values)), ci95=ci95(values), n=len(values))
            rows.append(row)
    return rows


def _write_table(path: Path, rows: list[dict], keys: list[str]) -> None:
    cols = [*keys, "method", "metric", "mean", "ci95", "n"]
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for row in rows:
            w.writerow({c: row[c] for c in cols})


def print_table(rows: list[dict], keys: list[str], console: Console, metrics: tuple[str, ...] = (
        "gamma", "final.global_accuracy", "best.global_accuracy", "best.local_accuracy_mean", "best.server_accuracy",
        "best.global_auc", "best.local_auc_mean")) -> None:
    table = Table(title="sweep: mean ± 95% CI over seeds")
    for col in [*keys, "method", "metric", "mean ± CI", "n"]:
        table.add_column(col, justify="right")
    for row in rows:
        if row["metric"] in metrics:
            table.add_row(*[str(row[k]) for k in keys], row["method"], row["metric"], f"{row['mean']:.4f} ± {row['ci95']:.4f}", str(row["n"]))
    console.print(table)
