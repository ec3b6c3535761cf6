"""Γ, Γ_IID and its sd (repr: every digit) and the preparation's seconds, on digits and Fashion-MNIST, feature
clusters and Dirichlet 0.5; writes them to the JSON named. Run on two checkouts and compare the JSONs:

    PYTHONPATH=$PWD/src python results/benchmarks_cpu_2026-11-30c/gamma_same_bits.py OUT.json
"""

import json
import sys
import time
import warnings
from pathlib import Path

from hetfed.config import load_config
from hetfed.pipeline import prepare

warnings.simplefilter("ignore")
out = {}
for ds in ("digits", "fashion-mnist"):
    for kind in ("feature_clusters", "dirichlet"):
        alpha = ["partition.alpha=0.5"] if kind == "dirichlet" else []
        cfg = load_config("configs/default.yaml", [f"dataset.name={ds}", f"partition.kind={kind}", *alpha])
        t = time.perf_counter()
        h = prepare(cfg, progress=False).heterogeneity
        seconds = round(time.perf_counter() - t, 2)
        out[f"{ds}/{kind}"] = (repr(h.gamma), repr(h.gamma_iid), repr(h.gamma_iid_sd), seconds)
        print(ds, kind, out[f"{ds}/{kind}"], flush=True)
Path(sys.argv[1]).write_text(json.dumps(out))
