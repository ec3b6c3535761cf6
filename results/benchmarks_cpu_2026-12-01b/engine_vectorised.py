"""The vectorised executor's seconds per training round of one of ``benchmarks/engine.py``'s cases, the fastest of two
timings (no sequential executor, no ideal: what a base-against-new alternation needs).

    PYTHONPATH=CHECKOUT/src python results/benchmarks_cpu_2026-12-01b/engine_vectorised.py compute_bound 5
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import engine  # noqa: E402

from hetfed.executors.inprocess import InProcessExecutor  # noqa: E402

torch.set_num_threads(2)
case = engine.CASES[sys.argv[1]]
seconds = min(engine.seconds_per_round(case, InProcessExecutor(), int(sys.argv[2])) for _ in range(2))
print(json.dumps({"case": sys.argv[1], "vectorised_s_per_round": seconds}))
