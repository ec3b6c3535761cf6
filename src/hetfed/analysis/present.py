"""What a finished run or sweep shows: its figures and report.html, drawn from what it wrote.

The entry points (``hetfed.api``, ``hetfed.cli``, the Flower ServerApp) hand these to the
runner and the sweep, so what writes a run never imports what draws it. A figure or a
report that fails is a warning: the results are written, the page is a view of them.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from hetfed.console import make_console
from hetfed.runs.rundir import REPORT


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


def present_sweep(sweep_dir: Path, console: Console | None = None) -> None:
    """The sweep's ``report.html`` and the figures it keeps (``figures/``), each drawn once from what the sweep
    wrote (sweep.json, curves.csv); a figure that cannot be drawn is a warning."""
    from hetfed.analysis.report import write_report

    problems: list[str] = []
    try:
        write_report(sweep_dir, problems=problems)
    except Exception as err:
        _warn(console, REPORT, err, Path(sweep_dir))
    for problem in problems:
        (console or make_console()).print(f"warning: figure not drawn: {problem}", style="yellow", soft_wrap=True)
