"""Γ with its size-matched IID reference on the leaderboard's Fashion-MNIST split (20 Dirichlet-0.1 clients, raw
pixels): seconds of `measure` and of the whole preparation, peak RSS, Γ and Γ_IID, as one JSON line.

    PYTHONPATH=<checkout>/src python results/benchmarks_cpu_2026-11-29i/gamma_fmnist.py [--set overrides…]
"""

from __future__ import annotations

import json
import resource
import sys
import time
from pathlib import Path

import hetfed.pipeline as pipeline
from hetfed.config import load_config

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "leaderboard_fmnist.yaml"


def main() -> None:
    cfg = load_config(str(CONFIG), sys.argv[1:])
    out: dict[str, float] = {}
    measure = pipeline.measure

    def timed(*a, **k):
        t = time.perf_counter()
        result = measure(*a, **k)
        out["gamma_s"] = round(time.perf_counter() - t, 2)
        return result

    pipeline.measure = timed
    t = time.perf_counter()
    prep = pipeline.prepare(cfg, progress=False)
    out["prepare_s"] = round(time.perf_counter() - t, 2)
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    out["gamma"], out["gamma_iid"] = prep.heterogeneity.gamma, prep.heterogeneity.gamma_iid
    print(json.dumps(out))


if __name__ == "__main__":
    main()
