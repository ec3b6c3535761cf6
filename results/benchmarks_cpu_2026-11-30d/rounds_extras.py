"""Methods whose server sends more than a model (the default experiment with an MLP 64-32-10 on digits, evaluation
every round) in stacked sweeps of 1 and 20 seeds: the time in the lockstep a round of one method (ms), for one seed,
for 20, and their ratio. Run on two checkouts to compare (a copy of ../benchmarks_cpu_2026-11-30c/rounds_personal.py
with the methods as an argument):

    M=scaffold,fedproto,fedgen,feddbe,fedfomo
    PYTHONPATH=$PWD/src python results/benchmarks_cpu_2026-11-30d/rounds_extras.py 20 $M
"""

import sys
import tempfile
import time
import warnings
from pathlib import Path

from hetfed.config import load_config
from hetfed.executors import stacked_runs
from hetfed.runs.sweep import run_sweep

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
    names = sys.argv[2].split(",")
    methods = "methods=[" + ", ".join(f"{{name: {n}, algorithm: {n}}}" for n in names) + "]"
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        config = load_config("configs/default.yaml", [methods, f"train.rounds={rounds}", "train.eval_every=1",
                                                      "model.hidden=[32]"])
        run_sweep(config, {}, seeds=1, out=Path(tmp) / "warm", progress=False, stack=True)
        for n in (1, 20):
            inside[0] = 0.0
            run_sweep(config, {}, seeds=n, out=Path(tmp) / f"s{n}", progress=False, stack=True)
            out.append(inside[0] / rounds / len(names) * 1000)
    print(f"{out[0]:.2f} {out[1]:.2f} {out[1] / out[0]:.2f}")


if __name__ == "__main__":
    main()
