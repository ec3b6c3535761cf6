"""The CGAU protocol table of results/paper/README.md, from a sweep's runs.csv over partition.shuffle.

    python results/paper/cgau_protocol.py [FOLDER]    # default: results/paper/cgau_fmnist/protocol

One row per shuffle fraction: ReLU / CGAU on the clients' own test data (``local_accuracy_weighted``, the paper's
metric) and on the balanced global test set, best by validation (mean over seeds), with the paired CGAU − ReLU
difference [95% CI] and the seeds CGAU won. Generated, never typed: a test compares it with the README.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from hetfed.analysis.fidelity import load_runs, per_seed
from hetfed.analysis.paired import paired

HERE = Path(__file__).parent
FOLDER = HERE / "cgau_fmnist" / "protocol"
METRICS = ("best.local_accuracy_weighted", "best.global_accuracy")


def _num(x: float) -> str:
    return f"{x:+.3f}".replace("-", "−")


def table(folder: Path = FOLDER) -> str:
    rows = load_runs(folder)
    shuffles = sorted({r["partition.shuffle"] for r in rows if r["method"] == "cgau"}, key=float)
    lines = ["| shuffle | own test data: ReLU / CGAU | Δ | global test set: ReLU / CGAU | Δ |", "|---|---|---|---|---|"]
    for s in shuffles:
        cells = [s]
        for metric in METRICS:
            point = {"partition.shuffle": s}
            a, b = per_seed(rows, "cgau", metric, point), per_seed(rows, "relu", metric, point)
            seeds = sorted(set(a) & set(b))
            r = paired([a[k] for k in seeds], [b[k] for k in seeds])
            cells += [f"{np.mean([b[k] for k in seeds]):.3f} / {np.mean([a[k] for k in seeds]):.3f}",
                      f"{_num(r.mean)} [{_num(r.ci_low)}, {_num(r.ci_high)}], {r.wins}/{r.n}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python results/paper/cgau_protocol.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", nargs="?", type=Path, default=FOLDER, metavar="FOLDER")
    args = ap.parse_args(argv)
    if not (args.folder / "runs.csv").is_file():
        ap.error(f"folder {str(args.folder)!r} has no runs.csv: expected a results folder that hetfed sweep wrote")
    print(table(args.folder))
    return 0


if __name__ == "__main__":
    sys.exit(main())
