"""What a sweep costs after its runs: its tables (``curves.csv`` read from every run's metrics.csv) and its
presenting (figures and report.html), on a sweep directory of many long runs — #74's study as one program is not
done when its last round is.

Makes a stacked sweep of ``--seeds`` seeds × ``--rounds`` rounds of #74's CPU setting (logistic regression on digits,
10 Dirichlet-0.5 clients, evaluation every round: ~70 metrics.csv rows a run a round) unless ``--sweep DIR`` names one,
then times, in this process, ``write_curves`` and ``present_sweep`` twice (the first pays matplotlib's and scipy's
imports; the second is what a sweep that already imported them pays). Prints JSON. Run it with another commit's
``src/`` first on ``PYTHONPATH`` for a before/after on the same machine::

    python benchmarks/sweep_presenting.py --seeds 20 --rounds 300 [--sweep DIR]
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import sys
import tempfile
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--sweep", type=Path, default=None, help="an existing sweep directory (else one is made)")
    args = parser.parse_args()
    sweep = args.sweep
    if sweep is None:
        from hetfed.cli import main as cli

        sweep = Path(tempfile.mkdtemp(prefix="presenting_")) / "sweep"
        with contextlib.redirect_stdout(sys.stderr):  # this prints JSON only
            cli(["sweep", str(Path(__file__).resolve().parents[1] / "configs" / "default.yaml"), "--quiet", "--stack",
                 "--seeds", str(args.seeds), "--out", str(sweep), "--set", "model.kind=logreg",
                 "--set", "partition.kind=dirichlet", "--set", "partition.alpha=0.5", "--set", "train.eval_every=1",
                 "--set", "methods=[{name: fedavg, algorithm: fedavg}]", "--set", f"train.rounds={args.rounds}"])
    from hetfed.analysis.present import present_sweep
    from hetfed.analysis.report import base_config
    from hetfed.runs.sweep_tables import write_curves

    record = json.loads((sweep / "sweep.json").read_text())
    config = base_config(json.loads((sweep / "sweep_request.json").read_text()))
    runs = [(r["point"], r["seed"], Path(r["run_dir"])) for r in record["runs"]]
    t0 = time.perf_counter()
    write_curves(sweep / "curves.csv", runs, list(record["grid"]))
    curves_s = time.perf_counter() - t0
    # an older present_sweep took the sweep's table, grid, config (and before that its run directories) too
    parameters = inspect.signature(present_sweep).parameters
    extra = ([record["rows"], record["grid"], *([[(r["point"], Path(r["run_dir"])) for r in record["runs"]]]
                                               if "run_dirs" in parameters else []), config]
             if "table" in parameters else [])
    times = []
    for _ in range(2):
        t0 = time.perf_counter()
        present_sweep(sweep, *extra, None)
        times.append(time.perf_counter() - t0)
    rows = sum(len((d / "metrics.csv").read_text().splitlines()) - 1 for _p, _s, d in runs)
    print(json.dumps({"sweep": str(sweep), "runs": len(runs), "metrics_rows": rows,
                      "write_curves_s": round(curves_s, 3), "present_first_s": round(times[0], 3),
                      "present_again_s": round(times[1], 3)}, indent=2))


if __name__ == "__main__":
    main()
