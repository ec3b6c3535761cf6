"""Γ and Γ_IID (one draw) of a Dirichlet-0.5 split measured under 1 and 2 BLAS threads, with the seconds.

    PYTHONPATH=$PWD/src python results/benchmarks_cpu_2026-11-30c/gamma_blas_threads.py digits fashion-mnist
"""

import sys
import time
import warnings

from threadpoolctl import threadpool_limits

from hetfed.config import load_config
from hetfed.heterogeneity import measure
from hetfed.pipeline import build_federation

warnings.simplefilter("ignore")
for ds in sys.argv[1:]:
    cfg = load_config("configs/default.yaml", [f"dataset.name={ds}", "partition.kind=dirichlet", "partition.alpha=0.5"])
    fed = build_federation(cfg, progress=False).federation
    clients = [fed.measured_rows(k, "train") for k in range(fed.n_clients)]
    for n in (1, 2):
        t = time.perf_counter()
        with threadpool_limits(n):
            h = measure(fed.x, fed.y, clients, fed.n_classes, iid_draws=1)
        print(ds, n, repr(h.gamma), repr(h.gamma_iid), round(time.perf_counter() - t, 1), flush=True)
