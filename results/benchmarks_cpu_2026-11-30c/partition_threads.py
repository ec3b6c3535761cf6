"""The default experiment's federation (feature_clusters) on Fashion-MNIST, MNIST and digits, seeds 0-2, built
under 1 and under 2 threads of every pool (threadpoolctl: OpenMP and BLAS): True when every client's training
indices are the same; and the seconds both builds took.

    PYTHONPATH=$PWD/src python results/benchmarks_cpu_2026-11-30c/partition_threads.py fashion-mnist mnist digits
"""

import sys
import time
import warnings

import numpy as np
from threadpoolctl import threadpool_limits

from hetfed.config import load_config
from hetfed.pipeline import build_federation

warnings.simplefilter("ignore")
for ds in sys.argv[1:]:
    for seed in range(3):
        cfg = load_config("configs/default.yaml", [f"dataset.name={ds}", f"seed={seed}"])
        out = {}
        t = time.perf_counter()
        for n in (1, 2):
            with threadpool_limits(n):
                out[n] = np.concatenate(build_federation(cfg, progress=False).federation.train)
        same = len(out[1]) == len(out[2]) and bool((out[1] == out[2]).all())
        print(ds, seed, same, round(time.perf_counter() - t, 1), flush=True)
