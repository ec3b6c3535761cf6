"""Flower's own floor: a minimal ServerApp + ClientApp with no ML on the same loopback deployment, exchanging per
round what a hetfed round exchanges (one training message per SuperNode carrying the model, one reply carrying an
update of the same size), so that hetfed's deployment round can be read as a multiple of what Flower itself costs.

The App is written to a temporary directory and submitted with ``flwr run`` to a :class:`LocalDeployment` (a
SuperLink and K SuperNodes, as ``benchmarks/engines.py``'s ``deployment-Knodes``). Its ClientApp imports only Flower
and NumPy and echoes the arrays it receives; its ServerApp polls for replies from 10 ms, backing off to 0.5 s, as
hetfed's does (Flower's ``Grid.send_and_receive`` sleeps 3 s between polls on a deployment: that would be a floor of
Flower's defaults, not of Flower). Each round's seconds are written by the ServerApp to a JSON file.

    python benchmarks/flower_floor.py --nodes 4 --floats 8970 --rounds 3 [--shape records|state] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

PYPROJECT = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "flower-floor"
version = "1.0.0"
description = "Flower's floor: no ML, hetfed's message pattern"
license = "Apache-2.0"
dependencies = []

[tool.hatch.build.targets.wheel]
packages = ["."]

[tool.flwr.app]
publisher = "hetfed"

[tool.flwr.app.components]
serverapp = "floorapp.apps:server"
clientapp = "floorapp.apps:client"

[tool.flwr.app.config]
nodes = 1
rounds = 1
floats = 1
out = ""
shape = ""
"""

APPS = '''\
"""The floor's ServerApp and ClientApp (written by benchmarks/flower_floor.py)."""

import json
import os
import time

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp

IMPORTED = time.time()


def _process_start():
    with open("/proc/self/stat") as fh:
        ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as fh:
        boot = next(float(line.split()[1]) for line in fh if line.startswith("btime"))
    return boot + ticks / os.sysconf("SC_CLK_TCK")

client = ClientApp()
server = ServerApp()


@client.train()
def train(msg: Message, context: Context) -> Message:
    """Echo the arrays (an update of the model's size) with a sample count; with HETFED_FLOWER_TIMING set, this
    process's start, the end of its imports and its reply go there (as hetfed's ClientApp writes them)."""
    if os.environ.get("HETFED_FLOWER_TIMING"):
        with open(os.environ["HETFED_FLOWER_TIMING"], "a") as fh:
            fh.write(json.dumps({"type": "train", "process_start": _process_start(), "imported": IMPORTED,
                                 "replied": time.time()}) + "\\n")
    if "hetfed.run" in msg.content:  # shaped as hetfed's: its parameters and metrics back, states kept
        if msg.content.config_records["hetfed.run"].get("state"):
            for k in range(3):
                context.state[f"hetfed.state.node.{k}"] = ArrayRecord([np.zeros(64, dtype=np.float32)] * 4)
        return Message(RecordDict({"params": msg.content["params"],
                                   "metrics": MetricRecord({"num-examples": 1, "train_loss": 0.5})}), reply_to=msg)
    return Message(RecordDict({"arrays": msg.content["arrays"], "metrics": MetricRecord({"num-examples": 1})}),
                   reply_to=msg)


def exchange(grid: Grid, messages: list) -> list:
    pending = set(grid.push_messages(messages))
    replies, wait = [], 0.01
    while pending:
        got = list(grid.pull_messages(pending))
        replies.extend(got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        if pending:
            time.sleep(wait)
            wait = 0.01 if got else min(2 * wait, 0.5)
    return replies


@server.main()
def main(grid: Grid, context: Context) -> None:
    cfg = context.run_config
    nodes, rounds, floats = int(cfg["nodes"]), int(cfg["rounds"]), int(cfg["floats"])
    t0 = time.perf_counter()
    while len(list(grid.get_node_ids())) < nodes:
        time.sleep(0.05)
    ids = sorted(grid.get_node_ids())[:nodes]
    connect = time.perf_counter() - t0
    model = ArrayRecord([np.zeros(floats, dtype=np.float32)])
    shape = str(cfg.get("shape", ""))
    sizes = [floats // 10] * 9 + [floats - 9 * (floats // 10)]
    # distinct values: Flower stores content-addressed objects once, so ten equal arrays would travel as one
    params = ArrayRecord([np.full(n, i, dtype=np.float32) for i, n in enumerate(sizes)])

    def content():
        """The floor's one array, or (``shape``) the same floats in hetfed's six records and ten arrays."""
        if not shape:
            return RecordDict({"arrays": model})
        return RecordDict({"params": params, "bc_extra.arrays": ArrayRecord([]),
                           "bc_extra.values": ConfigRecord({"a": 1, "b": 2}),
                           "bc": ConfigRecord({"round": 1, "lr": 0.1}),
                           "hetfed.run": ConfigRecord({"config": "x" * 3000, "method": 0, "state": shape == "state"}),
                           "hetfed.clients": ConfigRecord({"ids": [1, 2, 3], "offset": 0})})

    seconds = []
    for _ in range(rounds):
        t = time.perf_counter()
        replies = exchange(grid, [Message(content(), dst_node_id=n, message_type="train") for n in ids])
        assert len(replies) == nodes and not any(r.has_error() for r in replies)
        seconds.append(time.perf_counter() - t)
    with open(cfg["out"], "w") as fh:
        json.dump({"seconds_per_round": seconds, "connect_seconds": connect}, fh)
'''


def write_floor_app(directory: Path) -> Path:
    (directory / "floorapp").mkdir(parents=True, exist_ok=True)
    (directory / "pyproject.toml").write_text(PYPROJECT)
    (directory / "floorapp" / "__init__.py").write_text("")
    (directory / "floorapp" / "apps.py").write_text(APPS)
    return directory


def floor_rounds(nodes: int, floats: int, rounds: int, tmp: Path, shape: str = "") -> dict:
    """Seconds of each floor round on a fresh loopback deployment of ``nodes`` SuperNodes (the first round
    included: like hetfed's, it pays the ClientApps' first start). ``shape``: "records" sends the same floats in
    hetfed's record layout (six records, ten arrays, a 3 KB config text) and gets hetfed's reply layout back;
    "state" also keeps three clients' states in each node's context — what Flower's own work costs for
    hetfed-shaped messages, with no hetfed code running."""
    from hetfed.flower.deploy import CONNECTION, LocalDeployment, _bin

    app = write_floor_app(tmp / f"floor-app-{nodes}")
    out = tmp / f"floor-{nodes}.json"
    overrides = app / "run-config.toml"
    overrides.write_text(f"nodes = {nodes}\nrounds = {rounds}\nfloats = {floats}\nout = {json.dumps(str(out))}\n"
                         f"shape = {json.dumps(shape)}\n")
    timing = tmp / f"floor-timing-{nodes}.jsonl"
    os.environ["HETFED_FLOWER_TIMING"] = str(timing)  # the SuperNodes' ClientApps inherit it
    try:
        with LocalDeployment(tmp / f"floor-dep-{nodes}", nodes) as dep:
            done = subprocess.run([_bin("flwr"), "run", str(app), CONNECTION, "--run-config", str(overrides),
                                   "--stream"], env=dep.env(), capture_output=True, text=True, timeout=1800)
            if done.returncode != 0 or not out.exists():
                raise RuntimeError((done.stdout + done.stderr)[-2000:])
    finally:
        os.environ.pop("HETFED_FLOWER_TIMING", None)
    measured = json.loads(out.read_text())
    per_round = measured["seconds_per_round"]
    mean = sum(per_round) / len(per_round)
    row = {"seconds_per_round": mean, "rounds": rounds, "each": per_round, "shape": shape or "floor",
           "first_round_seconds": per_round[0],
           **({"steady_seconds_per_round": sum(per_round[1:]) / (len(per_round) - 1)} if len(per_round) > 1 else {}),
           "connect_seconds": measured["connect_seconds"], "floats": floats}
    lines = [json.loads(line) for line in timing.read_text().splitlines()] if timing.exists() else []
    if lines:  # the same split as hetfed's deployment rows: its ClientApp processes' life and the rest
        life = sum(r["replied"] - r["process_start"] for r in lines) / len(lines)
        row["breakdown"] = {"imports": sum(r["imported"] - r["process_start"] for r in lines) / len(lines),
                            "clientapp_life": life, "outside_the_clientapp": mean - life, "messages": len(lines)}
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--floats", type=int, default=8970, help="the model's parameter count (default: the "
                        "default experiment's MLP 64-64 on digits)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shape", choices=["", "records", "state"], default="",
                        help="hetfed's record layout (records), and clients' states in the context too (state)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as d:
        result = floor_rounds(args.nodes, args.floats, args.rounds, Path(d), args.shape)
    print(json.dumps(result) if args.json else json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
