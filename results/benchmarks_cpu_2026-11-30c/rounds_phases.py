"""#74's CPU setting (logreg on digits, 10 Dirichlet-0.5 clients, FedAvg, evaluation every round), stacked sweeps
of the seeds named: milliseconds a round in each part of the lockstep (the runs' own work between requests, the
joined client steps, read-backs, evaluation, servers' scores, summaries) and the lockstep in all.

    PYTHONPATH=$PWD/src python results/benchmarks_cpu_2026-11-30c/rounds_phases.py 60 1 20
"""

import collections
import sys
import tempfile
import time
import warnings
from pathlib import Path

from hetfed.config import load_config
from hetfed.executors import stacked_runs as sr
from hetfed.runs.sweep import run_sweep

OVERRIDES = ["model.kind=logreg", "partition.kind=dirichlet", "partition.alpha=0.5", "train.eval_every=1",
             "methods=[{name: fedavg, algorithm: fedavg}]"]
T: collections.Counter = collections.Counter()


def timed(name, fn):
    def call(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            T[name] += time.perf_counter() - t
    return call


def main() -> None:
    warnings.simplefilter("ignore")
    sr._Rounds.advance = timed("advance(own work)", sr._Rounds.advance)
    for name in ("train_together", "evaluate_together", "_read_back_together", "_summarise_together"):
        setattr(sr, name, timed(name.strip("_"), getattr(sr, name)))
    sr.Rendezvous.score_together = timed("score", sr.Rendezvous.score_together)
    sr.Rendezvous.lockstep = timed("LOCKSTEP", sr.Rendezvous.lockstep)
    rounds = int(sys.argv[1])
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config("configs/default.yaml", [*OVERRIDES, f"train.rounds={rounds}"])
        run_sweep(config, {}, seeds=1, out=Path(tmp) / "warm", progress=False, stack=True)
        for n in map(int, sys.argv[2:]):
            T.clear()
            run_sweep(config, {}, seeds=n, out=Path(tmp) / f"s{n}", progress=False, stack=True)
            print(n, {k: round(v / rounds * 1000, 2) for k, v in T.items()})


if __name__ == "__main__":
    main()
