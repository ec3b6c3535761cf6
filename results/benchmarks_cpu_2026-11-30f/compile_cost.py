"""What compiling a stacked step costs and how fast it then runs (``train.capture: compile``, #74 §4).

A stack shaped like the default experiment's (10 clients × 150 samples of 64 features, MLP 64-64-64-10, batch 32, one
epoch, plain SGD), its dropout from the command line. Prints the seconds to compile (the first two rounds: one step
shape compiled), the milliseconds a round over 300 rounds compiled and eager in turn, twice (the first compiled pass
also compiles the rounds' partial-batch shape), and the largest difference between a compiled and an eager round's
parameters. Run from the repository root, a cold cache each time:

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) PYTHONPATH=SRC:. python results/benchmarks_cpu_2026-11-30f/compile_cost.py 0.5
"""

from __future__ import annotations

import dataclasses
import sys
import time

import torch

from hetfed.config import OptimizerConfig
from hetfed.engine import capture
from hetfed.engine.local import LocalSchedule, train_stack
from hetfed.models import MLP
from tests.engine.test_capture import _data, _stack


def main(dropout: float) -> None:
    torch.set_num_threads(2)
    capture.Compiled.min_repeats = 3
    real = capture.Compiled.replay
    compiled: list[float] = []

    def timed(self: capture.Compiled) -> None:
        t0, made = time.perf_counter(), self._made
        real(self)
        if not made:
            compiled.append(round(time.perf_counter() - t0, 1))

    capture.Compiled.replay = timed  # type: ignore[method-assign]
    model = MLP(64, [64, 64], 10, dropout=dropout)
    data, opt = _data([150] * 10, d=64), OptimizerConfig(lr=0.05, momentum=0.0)
    params = _stack(model, 10)

    def one_round(mode: str, r: int):
        seeded = dataclasses.replace(data, seeds=[s + 7 * r for s in data.seeds])
        return train_stack(model, params, seeded, LocalSchedule(32, 1.0, capture=mode), opt, opt.lr)

    t0 = time.perf_counter()
    one_round("compile", 0)
    one_round("compile", 1)
    print("compile_s", round(time.perf_counter() - t0, 1), "each shape", compiled)
    ms: dict[str, list[float]] = {}
    for mode in ("compile", "off", "compile", "off"):
        t0 = time.perf_counter()
        for r in range(300):
            one_round(mode, r)
        ms.setdefault(mode, []).append(round((time.perf_counter() - t0) / 300 * 1000, 3))
    print("ms_per_round", ms)
    a, b = one_round("compile", 5)[0], one_round("off", 5)[0]
    print("max_abs_diff", max(float((a[k] - b[k]).abs().max()) for k in a))


if __name__ == "__main__":
    main(float(sys.argv[1]))
