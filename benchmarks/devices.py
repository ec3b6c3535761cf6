"""The same configs on the CPU and on a GPU: metrics side by side and seconds per round.

Runs the default experiment (CGAU vs ReLU, digits), FedMoE on digits and the
Fed-FSNet digits config with ``train.device`` = cpu and cuda, and prints, per
method, the final metrics on both, their largest absolute difference and the
seconds per training round. Not a test: nothing is asserted (a GPU's kernels
differ from the CPU's in the last bits, so only closeness is expected).

    python benchmarks/devices.py [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from hetfed.config import build_config
from hetfed.config_io import read_yaml
from hetfed.runs.runner import run_experiment

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "default": ({}, {"train": {"rounds": 50}}),
    "fedmoe_digits": (read_yaml(ROOT / "configs" / "fedmoe_digits.yaml"), {"train": {"rounds": 100}}),
    "fsnet_digits": (read_yaml(ROOT / "configs" / "fsnet_digits.yaml"), {"train": {"rounds": 10}}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    out: dict = {"devices": devices, "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
                 "torch": torch.__version__, "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (raw, overrides) in CASES.items():
            per_device = {}
            for device in devices:
                cfg = build_config(raw, {**overrides, "train": {**overrides.get("train", {}), "device": device}})
                t0 = time.perf_counter()
                summary = run_experiment(cfg, out=Path(tmp) / f"{name}-{device}", progress=False).summary
                per_device[device] = {"wall_seconds": time.perf_counter() - t0, "methods": {
                    m: {"final": v["final"], "seconds_per_round": v["seconds_per_round"]}
                    for m, v in summary["methods"].items()}}
            case = {"per_device": per_device}
            if len(devices) == 2:
                diffs = {}
                for m, v in per_device["cpu"]["methods"].items():
                    other = per_device["cuda"]["methods"][m]["final"]
                    diffs[m] = max((abs(a - other[k]) for k, a in v["final"].items()
                                    if a is not None and other.get(k) is not None), default=0.0)
                case["max_abs_metric_difference"] = diffs
            out["cases"][name] = case
            if not args.json:
                print(name, json.dumps(case.get("max_abs_metric_difference")), flush=True)
    print(json.dumps(out, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
