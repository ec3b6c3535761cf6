"""The rounds phase of stacked sweeps of 1 and 20 seeds (#74's CPU setting: logistic regression on digits, 10
Dirichlet-0.5 clients, FedAvg, evaluation every round), in milliseconds a round: the time the sweep's thread spends
in ``Rendezvous.lockstep`` (every run's rounds; preparation, start-up and summaries are outside it) over the rounds.
Prints ``one_seed twenty_seeds ratio``. Run from a checkout, its ``src`` first on ``PYTHONPATH``:

    PYTHONPATH=$PWD/src python results/benchmarks_cpu_2026-11-30b/rounds_phase.py 60
"""

import sys
import tempfile
import time
import warnings
from pathlib import Path

from hetfed.config import load_config
from hetfed.executors import stacked_runs
from hetfed.runs.sweep import run_sweep

OVERRIDES = ["model.kind=logreg", "partition.kind=dirichlet", "partition.alpha=0.5", "train.eval_every=1",
             "methods=[{name: fedavg, algorithm: fedavg}]"]
inside = [0.0]
lockstep = stacked_runs.Rendezvous.lockstep


def timed(self, batch):
    t0 = time.perf_counter()
    try:
        return lockstep(self, batch)
    finally:
        inside[0] += time.perf_counter() - t0


def main() -> None:
    warnings.simplefilter("ignore")
    stacked_runs.Rendezvous.lockstep = timed
    rounds = int(sys.argv[1])
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config("configs/default.yaml", [*OVERRIDES, f"train.rounds={rounds}"])
        run_sweep(config, {}, seeds=1, out=Path(tmp) / "warm", progress=False, stack=True)
        for n in (1, 20):
            inside[0] = 0.0
            run_sweep(config, {}, seeds=n, out=Path(tmp) / f"s{n}", progress=False, stack=True)
            out.append(inside[0] / rounds * 1000)
    print(f"{out[0]:.2f} {out[1]:.2f} {out[1] / out[0]:.2f}")


if __name__ == "__main__":
    main()
