"""Γ's distances side by side, one BLAS thread each, against one after another (#74 §2), measured in one run.

A run measures Γ, its size-matched IID reference and Γ(x|y) with its reference before its first round; on 784
features (Fashion-MNIST) that is most of a short run's preparation. Every distance is now computed on one BLAS thread
(``hetfed.heterogeneity.one_blas_thread``: Γ no longer depends on how many threads the BLAS has) and, from
``PARALLEL_FROM_FEATURES`` features, side by side on as many threads as the BLAS had. This times ``measure`` both
ways and as before (one distance at a time on all the BLAS's threads) in one process, alternated (``--repeats``;
medians), and checks that Γ is the same number with the BLAS on one thread and on all of them. JSON out; nothing
asserted.

    python benchmarks/gamma_threads.py [--config configs/leaderboard_fmnist.yaml] [--repeats 2]   # HETFED_DATA
    python benchmarks/gamma_threads.py --config configs/default.yaml --repeats 5                  # digits, 64
    python benchmarks/gamma_threads.py --features 128 192 256 384                                 # synthetic
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits

import hetfed.heterogeneity as het

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "leaderboard_fmnist.yaml"


@contextmanager
def _blas_as_it_is() -> Iterator[int]:
    """In place of ``one_blas_thread``: the BLAS left on all its threads, one distance at a time (how Γ was computed
    before its distances were limited to one thread each)."""
    yield 1


def timed_both(measure: Any, repeats: int, d: int) -> dict[str, Any]:
    """``measure()`` as before (one distance at a time on all the BLAS's threads), one after another on one thread
    each, and side by side, alternated, ``repeats`` times each: medians, the ratios, and whether the last two gave the
    same numbers (the first rounds by the BLAS's thread count, so it may not); ``now``: the way this code takes on ``d``
    features (side by side from ``PARALLEL_FROM_FEATURES``)."""
    kept = het.PARALLEL_FROM_FEATURES, het.one_blas_thread
    ways = {"as_before": (1 << 62, _blas_as_it_is), "one_after_another": (1 << 62, kept[1]),
            "side_by_side": (0, kept[1])}
    seconds: dict[str, list[float]] = {way: [] for way in ways}
    values = {}
    try:
        for _ in range(repeats):
            for way, (threshold, limit) in ways.items():
                het.PARALLEL_FROM_FEATURES, het.one_blas_thread = threshold, limit
                t0 = time.perf_counter()
                values[way] = measure()
                seconds[way].append(time.perf_counter() - t0)
    finally:
        het.PARALLEL_FROM_FEATURES, het.one_blas_thread = kept
    median = {way: statistics.median(s) for way, s in seconds.items()}
    now = "side_by_side" if d >= kept[0] else "one_after_another"
    return {**{f"{way}_s": round(s, 4) for way, s in median.items()}, "now": now,
            "now_over_as_before": round(median[now] / median["as_before"], 3),
            "side_by_side_over_as_before": round(median["side_by_side"] / median["as_before"], 3),
            "side_by_side_over_one_after_another": round(median["side_by_side"] / median["one_after_another"], 3),
            "same_numbers": values["one_after_another"] == values["side_by_side"],
            "as_before_same_numbers": values["as_before"] == values["side_by_side"]}


def of_config(path: str, repeats: int) -> dict[str, Any]:
    from hetfed.config import load_config
    from hetfed.pipeline import prepare

    config = load_config(path, [])
    fed, h = prepare(config, progress=False).federation, config.heterogeneity
    clients = [fed.measured_rows(k, h.on) for k in range(fed.n_clients)]

    def measure() -> tuple[float, ...]:
        r = het.measure(fed.x, fed.y, clients, fed.n_classes, iid_draws=h.iid_draws,
                        iid_max_clients=h.iid_max_clients, estimator=h.estimator, measured_on=h.on,
                        seed=config.seed, given_label=h.given_label)
        return r.gamma, r.gamma_iid, r.gamma_given_label, r.gamma_given_label_iid

    with threadpool_limits(limits=1, user_api="blas"):
        on_one = measure()
    out = {"config": Path(path).name, "features": int(np.prod(fed.input_shape)), "clients": fed.n_clients,
           **timed_both(measure, repeats, int(np.prod(fed.input_shape)))}
    here = measure()
    return {**out, "gamma": here[0], "same_with_one_blas_thread": on_one == here}


def synthetic(d: int, repeats: int) -> dict[str, Any]:
    """Γ and its IID reference of 20 Dirichlet-0.5-sized clients of 12 000 rows of ``d`` features."""
    rng = np.random.default_rng(0)
    x = (rng.normal(size=(12_000, d)) + rng.integers(0, 5, size=(12_000, 1))).astype(np.float32)
    clients = np.split(rng.permutation(12_000), np.cumsum(rng.dirichlet([0.5] * 20) * 12_000).astype(int)[:-1])
    return {"features": d, **timed_both(lambda: (het.gamma(x, clients), het.gamma_iid(x, clients, 3)), repeats, d)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(CONFIG))
    parser.add_argument("--features", type=int, nargs="*", help="synthetic data of these widths instead")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    blas = max((lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"), default=None)
    cases = [synthetic(d, args.repeats) for d in args.features] if args.features else [of_config(args.config,
                                                                                                  args.repeats)]
    print(json.dumps({"cpus": os.cpu_count(), "blas_threads": blas,
                      "parallel_from_features": het.PARALLEL_FROM_FEATURES, "cases": cases}, indent=2))


if __name__ == "__main__":
    main()
