"""What a finished run or sweep shows: its figures and report.html, drawn from what it wrote.

The entry points (``hetfed.api``, ``hetfed.cli``, the Flower ServerApp) hand these to the
runner and the sweep, so what writes a run never imports what draws it. A figure or a
report that fails is a warning: the results are written, the page is a view of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.console import Console

from hetfed.config import Config
from hetfed.console import make_console
from hetfed.runs.rundir import CURVES_TABLE, FIGURES, REPORT
from hetfed.runs.sweep_tables import read_curves_table


def _warn(console: Console | None, what: str, err: Exception, directory: Path) -> None:
    (console or make_console(stderr=True)).print(
        f"warning: {what} not written: {type(err).__name__}: {err} (try: hetfed report {directory})",
        style="yellow", soft_wrap=True)


def present_run(run_dir: Path, status: Console | None = None) -> None:
    """``report.html`` of a finished run, and the figures it keeps (``figures/learning_curves.png``,
    ``figures/clients.png`` and their SVGs), each drawn once (:func:`hetfed.analysis.report.write_report`)."""
    from hetfed.console import stage

    run_dir = Path(run_dir)
    with stage(status, "writing the figures and report.html"):
        from hetfed.analysis.report import write_report

        try:
            write_report(run_dir)
        except Exception as err:
            _warn(status, REPORT, err, run_dir)


def present_sweep(sweep_dir: Path, table: list[dict], grid: dict[str, list[Any]], config: Config | None,
                  console: Console | None) -> None:
    """The sweep's figures (``figures/``) and ``report.html``, its learning curves read from its curves.csv."""
    from hetfed.analysis.report import write_report
    from hetfed.analysis.results import write_sweep_figures

    curves = read_curves_table(Path(sweep_dir) / CURVES_TABLE)
    for problem in write_sweep_figures(table, grid, curves, Path(sweep_dir) / FIGURES, config):
        (console or make_console()).print(f"warning: figure not drawn: {problem}", style="yellow", soft_wrap=True)
    try:
        write_report(sweep_dir)
    except Exception as err:
        _warn(console, REPORT, err, Path(sweep_dir))
