"""Where a stacked round's time goes: wall-clock timers wrapped around the lockstep's functions (inclusive times, so
nested entries overlap), the marginal milliseconds a round between a 50- and a 250-round stacked sweep of #74's CPU
setting; the wrappers add ~10 %.

    PYTHONPATH=CHECKOUT/src python results/benchmarks_cpu_2026-12-01b/buckets.py SEEDS [OVERRIDE ...]
"""

from __future__ import annotations

import importlib
import sys
import tempfile
import time
from pathlib import Path

import torch

from hetfed.config import load_config
from hetfed.runs.sweep import run_sweep

TARGETS = [
    "hetfed.executors.stacked_work:train_together",
    "hetfed.executors.stacked_work:evaluate_together",
    "hetfed.executors.stacked_runs:_alone",
    "hetfed.executors.stacked_runs:_read_back_together",
    "hetfed.executors.stacked_runs:_summarise_together",
    "hetfed.executors.stacked_runs:Rendezvous.score_together",
    "hetfed.executors.stacked_runs:_Rounds.advance",
    "hetfed.runs.checkpoint:Checkpointer.save",
    "hetfed.runs.observers:MetricsObserver.evaluated",
    "hetfed.runs.observers:MetricsObserver.trained",
    "hetfed.runs.observers:ProgressObserver.round_done",
    "hetfed.executors.updates:plan_round",
    "hetfed.engine.local:train_stack",
    "hetfed.engine.local:plan_steps",
    "hetfed.engine.local:_Step.__call__",
    "hetfed.executors.stacked_work:_joined_state",
    "hetfed.executors.stacked_work:_measured",
    "hetfed.engine.types:RoundUploads.result",
]

seconds: dict[str, float] = {}


def wrap(module: str, attr: str) -> None:
    owner = importlib.import_module(module)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    fn = getattr(owner, name)
    seconds[attr] = 0.0

    def timed(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            seconds[attr] += time.perf_counter() - t0

    setattr(owner, name, timed)


def sweep(rounds: int, seeds: int, overrides: list[str]) -> tuple[float, dict[str, float]]:
    config = load_config("configs/default.yaml", [
        "model.kind=logreg", "partition.kind=dirichlet", "partition.alpha=0.5", "train.eval_every=1",
        "methods=[{name: fedavg, algorithm: fedavg}]", f"train.rounds={rounds}", *overrides])
    for key in seconds:
        seconds[key] = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run_sweep(config, {}, seeds=seeds, out=Path(tmp) / "sweep", progress=False, stack=True)
        return time.perf_counter() - t0, dict(seconds)


def main() -> None:
    torch.set_num_threads(2)
    for target in TARGETS:
        wrap(*target.split(":"))
    n, overrides = int(sys.argv[1]), sys.argv[2:]
    sweep(10, n, overrides)  # warm-up
    (short, a), (long, b) = sweep(50, n, overrides), sweep(250, n, overrides)
    print(f"{n} seeds: {(long - short) / 200 * 1000:.2f} ms a round")
    for key in seconds:
        print(f"  {key:45s} {(b[key] - a[key]) / 200 * 1000:7.2f}")


if __name__ == "__main__":
    main()
