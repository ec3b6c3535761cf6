"""A seed's preparation of the default experiment (load, partition, Γ), ms a seed over seeds 1-20 after seed 0
warmed the imports; outside a sweep, so every seed loads the data anew.

    PYTHONPATH=CHECKOUT/src OMP_NUM_THREADS=1 python results/benchmarks_cpu_2026-12-01c/prep_time.py LABEL
"""

from __future__ import annotations

import sys
import time
import warnings

import torch

from hetfed.config import load_config
from hetfed.pipeline import prepare

warnings.simplefilter("ignore")
torch.set_num_threads(1)
configs = [load_config(None, [f"seed={s}"]) for s in range(21)]
prepare(configs[0], progress=False)
t0 = time.perf_counter()
for config in configs[1:]:
    prepare(config, progress=False)
print(sys.argv[1], f"ms a seed {(time.perf_counter() - t0) / 20 * 1e3:.1f}")
