"""One case of ``benchmarks/engine.py`` here and in another checkout, alternated: before/after figures of a change.

This project's machines drift in speed by tens of percent within minutes (a shared host), so two timings taken
minutes apart compare the windows, not the code. Here every pair runs the two checkouts back to back, each in a
fresh process with its own ``src/`` and ``benchmarks/`` first on ``PYTHONPATH``, in alternating order; each process
times the vectorised round (the fastest of a few runs of ``--rounds`` rounds) and its own written-out ideal
(``engine.ideal_seconds_per_round(form="written_out")``: the ideal as that checkout writes it). Prints JSON: every
pair's figures, the medians, and the paired ratios ``this / base`` of the round. Not a test: nothing is asserted.

    python benchmarks/engine_against.py --base /path/to/other/checkout [--pairs 6] [--case overhead_bound]
                                        [--rounds 150]
    OMP_NUM_THREADS=1 python benchmarks/engine_against.py …   # one thread: steadier on a shared 2-core host
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(checkout: Path, case: str, rounds: int) -> None:
    """In a checkout's process: its round and its ideal, in milliseconds, as one JSON line (its ``src/`` and
    ``benchmarks/`` first on the path, ahead of this file's folder)."""
    sys.path[:0] = [str(checkout / "src"), str(checkout / "benchmarks")]
    from engine import CASES, ideal_seconds_per_round, seconds_per_round

    from hetfed.executors.inprocess import VectorisedExecutor

    try:  # as a hetfed run does, where the checkout has it (#74): freed memory kept for the next round
        from hetfed.engine.host_memory import keep_freed_memory
        keep_freed_memory()
    except ImportError:
        pass
    spec = CASES[case]
    vec = min(seconds_per_round(spec, VectorisedExecutor(), rounds) for _ in range(2 if rounds < 10 else 3))
    print(json.dumps({"round_ms": vec * 1e3, "ideal_written_out_ms": ideal_seconds_per_round(spec, form="written_out")
                      * 1e3}))


def timed(checkout: Path, case: str, rounds: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, __file__, "--child", str(checkout), "--case", case, "--rounds", str(rounds)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, help="the other checkout (a git worktree of the commit to compare with)")
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--case", default="overhead_bound")
    ap.add_argument("--rounds", type=int, default=150)
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.case, args.rounds)
        return
    if args.base is None:
        ap.error("--base: the checkout to compare with is required")
    checkouts = {"base": args.base.resolve(), "this": HERE.parent}
    runs: dict[str, list[dict[str, float]]] = {"base": [], "this": []}
    for i in range(args.pairs):
        for name in (("base", "this") if i % 2 == 0 else ("this", "base")):
            runs[name].append(timed(checkouts[name], args.case, args.rounds))
    report = {
        "case": args.case, "rounds": args.rounds, "pairs": args.pairs, "base": str(checkouts["base"]),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "runs": runs,
        "median": {name: {key: statistics.median(r[key] for r in rs) for key in ("round_ms", "ideal_written_out_ms")}
                   for name, rs in runs.items()},
        "round_over_ideal_median": {name: statistics.median(r["round_ms"] / r["ideal_written_out_ms"] for r in rs)
                                    for name, rs in runs.items()},
        "this_over_base_round": [t["round_ms"] / b["round_ms"]
                                 for t, b in zip(runs["this"], runs["base"], strict=True)],
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
