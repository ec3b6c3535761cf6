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


def _warn(console: Console | None, what: str, err: Exception, directory: Path) -> None:
    (console or make_console(stderr=True)).print(
        f"warning: {what} not written: {type(err).__name__}: {err} (try: hetfed report {directory})",
        style="yellow", soft_wrap=True)


def present_run(run_dir: Path, status: Console | None = None) -> None:
    """``figures/learning_curves.png``, ``figures/clients.png`` (and .svg) and ``report.html`` of a finished run."""
    import json

    from hetfed.analysis.figures import plot_learning_curves
    from hetfed.analysis.report import write_report
    from hetfed.analysis.results import run_curves

    run_dir = Path(run_dir)
    try:
        summary = json.loads((run_dir / "summary.json").read_text())
        best = {label: m.get("best_round") for label, m in summary.get("methods", {}).items()}
        plot_learning_curves(run_curves(run_dir), run_dir / "figures" / "learning_curves.png", best_rounds=best)
    except Exception as err:
        _warn(status, "figures/learning_curves.png", err, run_dir)
    try:  # who holds which classes: the client distribution, for trackers and for a look without the report
        import numpy as np

        from hetfed.analysis.figures import plot_partition_view

        with np.load(run_dir / "federation.npz") as z:
            plot_partition_view({k: z[k] for k in z.files}, run_dir / "figures" / "clients.png")
    except Exception as err:
        _warn(status, "figures/clients.png", err, run_dir)
    try:
        write_report(run_dir)
    except Exception as err:
        _warn(status, "report.html", err, run_dir)


def present_sweep(sweep_dir: Path, table: list[dict], grid: dict[str, list[Any]], run_dirs: list[tuple[dict, Path]],
                  config: Config | None, console: Console | None) -> None:
    """The sweep's figures (``figures/``) and ``report.html``."""
    from hetfed.analysis.report import write_report
    from hetfed.analysis.results import write_sweep_figures

    for problem in write_sweep_figures(table, grid, run_dirs, Path(sweep_dir) / "figures", config):
        (console or make_console()).print(f"warning: figure not drawn: {problem}", style="yellow", soft_wrap=True)
    try:
        write_report(sweep_dir)
    except Exception as err:
        _warn(console, "report.html", err, Path(sweep_dir))
