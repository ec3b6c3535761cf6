"""Whether a run repeats itself on this device, and whether a stacked sweep's numbers are its one-by-one sweep's.

On a GPU, FedBN's stacked sweep once differed from its one-by-one sweep by a flipped prediction
(results/gpu_h200_2026-12-04c, 0.47372 against 0.47818) where the same test had passed on another H200: a difference
between two kernels, or no difference at all but two runs of one sweep that do not repeat themselves (cuDNN picks
algorithms whose weight gradients add in no fixed order unless ``torch.backends.cudnn.deterministic``). This runs
the stacked-sweep test's setting (the default experiment, 4 clients, 2 rounds of 2 steps, 2 seeds, evaluated every
round) for ``--methods`` (default: FedBN on cnn4 with batch norm, the one convolutional method of that test) three
times — one by one, one by one again, stacked — with cuDNN as PyTorch leaves it and then with its deterministic
algorithms, and prints JSON: for each, how many values of every run's metrics.csv differ between the two one-by-one
sweeps (``repeat``) and between one by one and stacked (``stacked``), the largest difference of a loss and of an
accuracy, and each sweep's wall seconds. Nothing is asserted. On a CPU every count should be 0.

    python benchmarks/repeats.py [--device cpu|cuda] [--methods fedbn …] [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

from hetfed.cli import main as hetfed
from hetfed.registry import registry_of
from hetfed.runs.rundir import read_metric_rows

DEFAULT = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"
#: metrics whose names mark a timing (left out: they differ between any two runs)
TIMINGS = ("seconds", "_s", "time", "rate")


def _metrics(path: Path) -> dict[tuple, float]:
    """Every run's metrics.csv but its timings, keyed by run, method, round, split, client and metric."""
    return {(run.name, r["method"], r["round"], r["split"], r["client"], r["metric"]): float(r["value"])
            for run in sorted(path.glob("*/seed=*")) for r in read_metric_rows(run / "metrics.csv")
            if r["value"] != "" and not any(t in r["metric"] for t in TIMINGS)}


def _compared(a: dict[tuple, float], b: dict[tuple, float]) -> dict[str, float]:
    differ = [k for k in a if a[k] != b.get(k)]
    gap = {kind: max((abs(a[k] - b[k]) for k in differ if kind in k[-1] and k in b), default=0.0)
           for kind in ("loss", "accuracy")}
    return {"values": len(a), "differ": len(differ), "missing": len(a.keys() ^ b.keys()),
            "max_loss_gap": gap["loss"], "max_accuracy_gap": gap["accuracy"]}


def _sweep(args: list[str], out: Path, stack: bool) -> float:
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(sys.stderr):  # stdout: the JSON alone
        code = hetfed([*args, "--out", str(out), *(["--stack"] if stack else [])])
    if code != 0:
        raise SystemExit(f"hetfed sweep exited {code} ({out})")
    return round(time.perf_counter() - t0, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--methods", nargs="+", default=["fedbn"])
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    algorithms = registry_of("algorithm")
    methods = [{"name": f"{n}_", "algorithm": n, "params": dict(algorithms.get(n).quick),
                **({"model": dict(algorithms.get(n).model)} if algorithms.get(n).model else {})} for n in args.methods]
    sweep = ["sweep", str(DEFAULT), "--set", f"train.device={args.device}", "--set", f"train.rounds={args.rounds}",
             "--set", "partition.clients=4", "--set", "train.local_steps=2", "--set", "heterogeneity.iid_draws=0",
             "--set", "train.eval_every=1", "--set", f"methods={json.dumps(methods)}", "--seeds", "2", "--quiet",
             "--no-report"]
    report: dict[str, object] = {"device": args.device, "gpu": torch.cuda.get_device_name() if args.device == "cuda"
                                 else None, "torch": torch.__version__, "methods": args.methods}
    for mode in ("cudnn_default", "cudnn_deterministic"):
        torch.backends.cudnn.deterministic = mode == "cudnn_deterministic"
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            seconds = {name: _sweep(sweep, root / name, name == "stacked") for name in ("first", "again", "stacked")}
            first, again, stacked = (_metrics(root / name) for name in ("first", "again", "stacked"))
        report[mode] = {"repeat": _compared(first, again), "stacked": _compared(first, stacked), "seconds": seconds}
        print(json.dumps({mode: report[mode]}), file=sys.stderr, flush=True)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
