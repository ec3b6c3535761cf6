"""hetfed's sweeps from Python: run a grid × seeds, check it first, read it back (re-exported by ``import hetfed``;
runs, federations and configs: :mod:`hetfed.api`). Worked examples: ``docs/api.md``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hetfed.api import Folder, Run, _config, _flag, _pandas, report
from hetfed.config import Config
from hetfed.errors import ConfigError, RunError
from hetfed.runs.rundir import RUNS_TABLE, SWEEP_RECORD, SWEEP_TABLE

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Sweep", "open_sweep", "sweep", "sweep_dry_run"]


@dataclass(eq=False)
class Sweep(Folder):
    """A sweep directory read back: the aggregated table and every run."""

    @cached_property
    def record(self) -> dict:
        return json.loads((self.dir / SWEEP_RECORD).read_text())

    def table(self) -> pd.DataFrame:
        """sweep.csv: grid keys, method, metric, mean, ci95 (Student t over seeds), n."""
        return _pandas().read_csv(self.dir / SWEEP_TABLE)

    def results(self, metric: str = "best.global_accuracy") -> pd.DataFrame:
        """One metric as grid points × methods (means; CIs in :meth:`table`)."""
        df = self.table()
        keys = list(self.record["grid"])
        from hetfed.runs.sweep_tables import check_metrics

        check_metrics([metric], df["metric"])
        sel = df[df["metric"] == metric]
        return sel.pivot_table(index=keys or None, columns="method", values="mean") if keys else \
            sel.set_index("method")[["mean", "ci95", "n"]]

    def values(self) -> pd.DataFrame:
        """runs.csv: every run's own value (grid keys, seed, method, metric, value) — one row per seed."""
        pd = _pandas()
        path = self.dir / RUNS_TABLE
        if not path.is_file():
            raise ConfigError(f"{path} is missing: sweeps made before it existed have none; write it with "
                              f"`hetfed sweep CONFIG … --resume --out {self.dir}` (completed runs are reused)")
        return pd.read_csv(path)

    def paired(self, method: str, baseline: str, metric: str = "best.global_accuracy",
               tuned_by: str | None = None) -> pd.DataFrame:
        """``method − baseline`` per grid point, paired by seed (both ran on the same federation): mean,
        95% CI, Wilcoxon p, wins — :func:`hetfed.analysis.paired.paired`. ``tuned_by`` (e.g. ``"best.val_loss"``):
        each of the two at the grid point that metric chose for it (:meth:`tuned`), paired by seed within each task
        (the seeds of one value of the data's keys share their federation whatever the setting), the two points in
        ``method_point`` and ``baseline_point``."""
        from hetfed.analysis.paired import paired

        pd = _pandas()
        df = self.values()
        known = sorted(df["method"].unique())
        for name in (method, baseline):
            if name not in known:
                raise ConfigError(f"method {name!r} is not in this sweep: expected one of {known}")
        from hetfed.runs.sweep_tables import check_metrics

        check_metrics([metric], df["metric"])
        sel = df[df["metric"] == metric]
        keys = list(self.record["grid"])
        wide = sel.pivot_table(index=[*keys, "seed"], columns="method", values="value")
        if tuned_by is not None:
            from hetfed.analysis.paired import paired_at_chosen
            from hetfed.runs.sweep_tables import check_choice, tuned

            rows = self.record.get("rows") or []
            check_choice(keys, rows, [tuned_by])
            return pd.DataFrame(paired_at_chosen(wide, keys, tuned(rows, keys, tuned_by), method, baseline))
        rows = []
        for point, block in (wide.groupby(level=keys) if keys else [((), wide)]):
            r = paired(block[method].tolist(), block[baseline].tolist())
            point = point if isinstance(point, tuple) else (point,)
            rows.append({**dict(zip(keys, point, strict=True)), "n": r.n, "mean": r.mean, "ci_low": r.ci_low,
                         "ci_high": r.ci_high, "wilcoxon_p": r.wilcoxon_p, "wins": r.wins})
        return pd.DataFrame(rows)

    def tuned(self, by: str = "best.val_loss",
              metrics: Sequence[str] = ("best.global_accuracy", "best.local_accuracy_mean"),
              held_out: bool = False) -> pd.DataFrame:
        """Each method at the grid point its validation chose: the lowest mean over seeds of ``by`` (a loss; the
        highest of any other metric) among the points that differ only in the method's own settings — within each
        value of a key of the task or the scenario (the data, an attack, ε, the rounds) — and ``metrics`` there
        (mean, 95% CI, seeds): methods compared each at its own setting, chosen without its test scores
        (:func:`hetfed.runs.sweep_tables.tuned`). ``held_out``: each seed's metrics at the point chosen on the
        other seeds (leave one seed out; ``chosen``: how often each point was), so that no number comes from a
        choice its own seed took part in (:func:`hetfed.runs.sweep_tables.tuned_held_out`)."""
        from hetfed.runs.sweep_tables import check_choice, tuned_held_out, tuned_rows

        pd = _pandas()
        keys, rows = list(self.record["grid"]), self.record.get("rows") or []
        check_choice(keys, rows, [by, *metrics])
        found = (tuned_held_out(self.values().to_dict("records"), keys, by, metrics) if held_out else
                 [{**row, **row["point"], by: row["by"]} for row in tuned_rows(rows, keys, by, metrics)])
        out = []
        for row in found:
            shown: dict[str, Any] = {}
            for m in metrics:  # mean, CI and seeds where the method has the metric at its point; else None
                cell = row[m]
                shown.update({m: cell["mean"], f"{m}.ci95": cell["ci95"], f"{m}.n": cell["n"]} if cell else {m: None})
            out.append({k: v for k, v in row.items() if k not in ("point", "by", *metrics)} | shown)
        return pd.DataFrame(out)

    @property
    def runs(self) -> list[Run]:
        return [Run(Path(r["run_dir"])) for r in self.record["runs"]]

    def report(self, out: str | Path | None = None) -> Path:
        return report(self.dir, out)


def sweep(config: str | Path | dict | Config | None, grid: dict[str, list[Any]], seeds: int = 3,
          out: str | Path | None = None, jobs: int = 1, resume: bool = False, progress: bool = False,
          stack: bool = False, report: bool = True, each_method: bool = False) -> Sweep:
    """Run every grid point × seed (``grid = {"partition.shuffle": [0, 0.5, 1]}``) and aggregate with 95% CIs.

    ``stack``: train the runs in this process as one stack of clients per round (``hetfed sweep --stack``);
    ``each_method``: each method a run of its own, the tables as one run's (``--each-method``: stacked side by side).
    ``report``: False draws no figures and no report.html (``--no-report``; :meth:`Sweep.report` draws them later)."""
    from rich.console import Console

    from hetfed.analysis.present import present_sweep
    from hetfed.console import make_console
    from hetfed.runs.sweep import run_sweep

    progress, resume, stack, each_method = (_flag("progress", progress), _flag("resume", resume),
                                            _flag("stack", stack), _flag("each_method", each_method))
    console = make_console() if progress else Console(quiet=True)
    sweep_dir, _ = run_sweep(_config(config), _grid(grid), seeds=seeds, out=out,
                             progress=progress, console=console, resume=resume, jobs=jobs,
                             present=present_sweep if _flag("report", report) else None, stack=stack,
                             each_method=each_method)
    return Sweep(Path(sweep_dir))


def sweep_dry_run(config: str | Path | dict | Config | None, grid: dict[str, list[Any]], seeds: int = 3,
                  out: str | Path | None = None, jobs: int = 1, resume: bool = False, stack: bool = False,
                  each_method: bool = False) -> pd.DataFrame:
    """What :func:`sweep` of these arguments would do (``hetfed sweep --dry-run``), checked as it checks them —
    every run it would not reuse planned on its own data — with nothing trained or written: a row per run, its
    folder within the sweep's (``run``) and its ``fate``: ``train``, ``refused: <why>`` (the sweep would record it
    failed) or, resuming ``out``, ``reuse``, ``continue`` or ``redo``. A sweep it would refuse whole raises as
    :func:`sweep` does."""
    from hetfed.runs.sweep import dry_run

    fates = dry_run(_config(config), _grid(grid), seeds, out, _flag("resume", resume), jobs, _flag("stack", stack),
                    _flag("each_method", each_method))
    return _pandas().DataFrame([(str(run), fate) for run, fate in fates], columns=["run", "fate"])


def _grid(grid: object) -> dict[str, list[Any]]:
    """The grid as lists (an empty one :func:`~hetfed.runs.sweep.plan_sweep` refuses, as the command's)."""
    if not isinstance(grid, dict) or not all(isinstance(v, list | tuple) for v in grid.values()):
        raise ConfigError(f"grid={grid!r} is not allowed: expected a dict of key → list of values")
    return {k: list(v) for k, v in grid.items()}


def open_sweep(directory: str | Path) -> Sweep:
    d = Path(directory)
    if not (d / SWEEP_RECORD).is_file():
        raise RunError(f"{str(d)!r} is not a sweep directory: expected sweep.json in it (written by hetfed sweep)")
    return Sweep(d)
