"""A sweep whose runs share their preparation (#74 §2) against the same sweep with every run preparing its own.

A grid over a setting that leaves the data alone (here the learning rate, or a list of methods as grid points) used to
load, partition and measure Γ once per run; now once per distinct (data, partition, Γ settings, seed). One process,
the two sweeps one after the other (the shared one second, so the first pays the process's warm-up), JSON out.

    python benchmarks/shared_preparation.py [--dataset fashion-mnist] [--points 4] [--seeds 1] [--rounds 1]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
import time
from pathlib import Path

from hetfed.cli import main as cli
from hetfed.runs import sweep

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "leaderboard_fmnist.yaml"


def timed(args: list[str], out: Path) -> float:
    t0 = time.perf_counter()
    assert cli([*args, "--out", str(out)]) == 0
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="fashion-mnist")
    ap.add_argument("--points", type=int, default=4, help="grid points (learning rates) per seed")
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=1)
    a = ap.parse_args()
    lrs = ",".join(str(0.01 * (i + 1)) for i in range(a.points))
    args = ["sweep", str(CONFIG), "--set", f"dataset.name={a.dataset}", "--set", f"train.rounds={a.rounds}",
            "--set", "methods=[{algorithm: fedavg}]", "--grid", f"train.optimizer.lr={lrs}", "--seeds", str(a.seeds),
            "--quiet"]
    with tempfile.TemporaryDirectory() as tmp:
        shared_off = sweep.sharing
        sweep.sharing = contextlib.nullcontext  # every run prepares its own
        own = timed(args, Path(tmp) / "own")
        sweep.sharing = shared_off
        shared = timed(args, Path(tmp) / "shared")
    print(json.dumps({"dataset": a.dataset, "runs": a.points * a.seeds, "rounds": a.rounds,
                      "own_preparation_s": round(own, 2), "shared_preparation_s": round(shared, 2),
                      "speedup": round(own / shared, 2)}, indent=1))


if __name__ == "__main__":
    main()
