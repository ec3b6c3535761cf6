"""How many threads a worker process computes with: torch's pool and every BLAS and OpenMP pool loaded in it.

Why all of them: a sweep's ``--jobs N`` workers each get ``cores // N`` threads, and setting torch's pool (and the
``*_NUM_THREADS`` variables) was not enough. A worker is a spawned process that imports the sweep's module to unpickle
its task, and with it numpy, whose OpenBLAS reads its variable once, when loaded: it kept one thread per core. Two
workers measuring Γ (BLAS-heavy) then ran four threads on two cores, and OpenBLAS's idle threads spin: the same sweep
(PFLlib's Fashion-MNIST split, 3 methods × 3 seeds, ``--jobs 2``) took 52 s once and 369 s (723 CPU-seconds) the
next (``results/benchmarks_cpu_2026-11-29i``). threadpoolctl sets the pools already loaded; the variables reach those
loaded later.
"""

from __future__ import annotations

import os

#: the variables the BLAS and OpenMP libraries read when they are loaded
VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def limit_threads(n: int) -> None:
    """From now on this process computes with ``n`` threads: torch's, numpy's and scipy's BLAS, OpenMP's."""
    for var in VARIABLES:
        os.environ[var] = str(n)
    import numpy  # noqa: F401  # loaded now, so that threadpoolctl limits their pools below
    import scipy.linalg  # noqa: F401  # scipy's wheels bring an OpenBLAS of their own
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(n)
    threadpool_limits(limits=n)
