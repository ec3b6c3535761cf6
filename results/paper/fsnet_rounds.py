"""Which round a paper reports matters when FedAvg's curve oscillates: round statistics from a curves.csv.

    python results/paper/fsnet_rounds.py FOLDER [A B]    # default A = fsnet, B = fedavg

Per seed (from FOLDER/curves.csv, the sweep's round-by-round global accuracy): B's mean over
all rounds, its worst round after round 10 (and A's accuracy at that round), the share of rounds
where B is below 0.5, and the per-round paired difference A − B (mean over rounds, largest).
Printed as a markdown table; the README of results/paper quotes it.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np


def curves(folder: Path, metric: str = "global_accuracy") -> dict[tuple[str, str], dict[int, float]]:
    """(seed, method) → {round: value}; the first grid point only (a folder holds one setting)."""
    out: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
    with open(folder / "curves.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            if r["metric"] == metric:
                out[(r["seed"], r["method"])][int(r["round"])] = float(r["value"])
    return out


def round_table(folder: Path, a: str = "fsnet", b: str = "fedavg", after: int = 10) -> str:
    c = curves(folder)
    seeds = sorted({s for s, _ in c}, key=int)
    lines = [f"| seed | {b}: mean over rounds | {b}: worst round > {after} | {a} at that round | {b} rounds < 0.5 "
             f"| {a} rounds < 0.5 | {a} − {b} per round: mean | … largest |", "|---|---|---|---|---|---|---|---|"]
    stats = defaultdict(list)
    for s in seeds:
        ca, cb = c[(s, a)], c[(s, b)]
        rounds = sorted(set(ca) & set(cb))
        late = [r for r in rounds if r > after]
        worst = min(late, key=lambda r: cb[r])
        d = [ca[r] - cb[r] for r in rounds]
        row = [np.mean([cb[r] for r in rounds]), cb[worst], ca[worst], np.mean([cb[r] < 0.5 for r in rounds]),
               np.mean([ca[r] < 0.5 for r in rounds]), np.mean(d), max(d)]
        for i, v in enumerate(row):
            stats[i].append(v)
        lines.append(f"| {s} | {row[0]:.3f} | {row[1]:.3f} (round {worst}) | {row[2]:.3f} | {row[3]:.0%} | "
                     f"{row[4]:.0%} "
                     f"| {row[5]:+.3f} | {row[6]:+.3f} |")
    m = [np.mean(stats[i]) for i in range(7)]
    lines.append(f"| mean | {m[0]:.3f} | {m[1]:.3f} | {m[2]:.3f} | {m[3]:.0%} | {m[4]:.0%} | {m[5]:+.3f} | {m[6]:+.3f} "
                 "|")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python results/paper/fsnet_rounds.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, metavar="FOLDER")
    ap.add_argument("a", nargs="?", default="fsnet", metavar="A", help="the method compared (default fsnet)")
    ap.add_argument("b", nargs="?", default="fedavg", metavar="B", help="the baseline (default fedavg)")
    args = ap.parse_args(argv)
    if not (args.folder / "curves.csv").is_file():
        ap.error(f"folder {str(args.folder)!r} has no curves.csv: expected a results folder that hetfed sweep wrote")
    print(round_table(args.folder, args.a, args.b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
