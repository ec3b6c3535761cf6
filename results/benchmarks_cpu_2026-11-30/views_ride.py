"""FedMoE on a loopback deployment (4 SuperNodes on this machine): the run's wall time and the nodes' replies by
step (the wire log) — to compare a checkout whose views ride on
the personalisation's exchange with one that asks each view on its own (run it with each checkout's src first on
PYTHONPATH; the SuperNodes inherit it).

    PYTHONPATH=<checkout>/src python results/benchmarks_cpu_2026-11-30/views_ride.py
"""

from __future__ import annotations

import collections
import json
import os
import tempfile
import time
from pathlib import Path

import yaml

import hetfed
from hetfed.cli import main
from hetfed.flower.deploy import LocalDeployment

with tempfile.TemporaryDirectory() as tmp:
    wire = Path(tmp) / "wire.jsonl"
    os.environ["HETFED_FLOWER_WIRE_LOG"] = str(wire)  # what every node's ClientApp sent, one line per reply
    cfg = Path(tmp) / "moe.yaml"
    cfg.write_text(yaml.safe_dump({
        "partition": {"kind": "feature_clusters", "clients": 8, "opt_out": 0.25},
        "model": {"hidden": [16]},
        "train": {"executor": "flower", "rounds": 2, "batch_size": 16, "eval_every": 1},
        "flower": {"nodes": 4, "connect_timeout": 300},
        "methods": [{"algorithm": "fedmoe", "params": {"max_epochs": 2, "patience": 1}}]}))
    with LocalDeployment(Path(tmp) / "dep", 4):
        t0 = time.perf_counter()
        code = main(["flower", "run", str(cfg), "--deployment", str(Path(tmp) / "dep"), "--out", str(Path(tmp) / "r")])
        wall = time.perf_counter() - t0
    summary = json.loads((Path(tmp) / "r" / "summary.json").read_text())
    replies = collections.Counter(json.loads(line)["type"] for line in wire.read_text().splitlines())
print(json.dumps({"hetfed": hetfed.__file__, "exit": code, "run_s": round(wall, 1), "replies": dict(replies),
                  "mixture_local_acc": summary["methods"]["mixture"]["final"]["local_accuracy_mean"]}))
