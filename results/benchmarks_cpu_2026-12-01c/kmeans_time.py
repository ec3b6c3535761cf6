"""One k-means of 180 points in the plane, 10 clusters, 4 restarts (a digits class of feature_clusters): scikit-learn's
KMeans (one OpenMP thread, as the partition ran it) against hetfed.partition._kmeans, ms a fit over 50 seeds.

    OMP_NUM_THREADS=1 python results/benchmarks_cpu_2026-12-01c/kmeans_time.py
"""

from __future__ import annotations

import time

import numpy as np
from sklearn.cluster import KMeans
from threadpoolctl import threadpool_limits

from hetfed.partition._kmeans import kmeans

x = np.random.default_rng(0).normal(size=(180, 2)).astype(np.float32)
t0 = time.perf_counter()
for seed in range(50):
    with threadpool_limits(limits=1, user_api="openmp"):
        KMeans(n_clusters=10, n_init=4, random_state=seed).fit(x)
t1 = time.perf_counter()
for seed in range(50):
    kmeans(x, 10, 4, seed)
t2 = time.perf_counter()
print(f"sklearn {(t1 - t0) * 20:.2f} ms, hetfed {(t2 - t1) * 20:.2f} ms a fit")
