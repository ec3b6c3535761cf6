"""The cost of personalisation: seconds per training round of every registered personalised or clustered
method next to FedAvg, on the leaderboard's setting, measured in one run on one machine (#25).

Setting: PFLlib's protocol — Fashion-MNIST, 20 clients, Dirichlet α = 0.1, PFLlib's FedAvg CNN
(``model.kind: cnn4``), every client every round, E = 1, B = 10, SGD (no momentum) — for a few rounds
(``--rounds``). Without Fashion-MNIST (``apt install dataset-fashion-mnist``) it runs on digits with the
same protocol and says so. Each method runs alone, vectorised, in this process; seconds per round are
the run's own training clock (sample → broadcast → train → aggregate; evaluation excluded). Printed as
JSON lines, one per method as it finishes, then the table with each method's ratio to FedAvg. Not a
test: nothing is asserted.

    python benchmarks/personalised.py [--rounds 3] [--methods fedavg fedper …] [--dataset digits]
                                      [--model cnn4|mlp] [--json]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from hetfed.algorithms import registry
from hetfed.config import build_config
from hetfed.runs.runner import run_experiment

FMNIST = Path("/usr/share/datasets/fashion-mnist")


def personalised_methods() -> list[str]:
    """FedAvg, then every registered method whose clients end with models of their own."""
    return ["fedavg", *[s.name for s in registry.specs() if s.capabilities.personalises and s.name != "local"]]


def one(method: str, dataset: str, rounds: int, out: Path, model: str = "cnn4") -> dict:
    raw = {"name": f"bench-{method}", "dataset": {"name": dataset},
           "partition": {"kind": "dirichlet", "alpha": 0.1, "clients": 20, "min_size": 20},
           # the MLP 64-64 of the FMNIST leaderboard; a CNN takes no widths (a setting it does not read is refused)
           "model": {"kind": model, **({"hidden": [64, 64]} if model == "mlp" else {})},
           "heterogeneity": {"iid_draws": 0},  # not what is timed
           "train": {"rounds": rounds, "local_epochs": 1, "batch_size": 10, "eval_every": rounds,
                     "optimizer": {"kind": "sgd", "lr": 0.005, "momentum": 0.0}},
           "methods": [{"name": method, "algorithm": method,  # default params: the cost a user pays
                        **({"model": {**registry.get(method).model, "kind": "cnn4"}} if registry.get(method).model
                           else {})}]}
    if model == "mlp":  # the FMNIST leaderboard's setting (configs/leaderboard_fmnist.yaml): SGD 0.05
        raw["train"]["optimizer"]["lr"] = 0.05
    summary = run_experiment(build_config(raw), out=out / method, progress=False).summary
    caps = registry.get(method).capabilities  # a method with views: its federated phase's row is the round's cost
    m = summary["methods"][caps.federated_view if caps.views else next(iter(summary["methods"]))]
    return {"method": method, "dataset": dataset, "rounds": rounds,
            "seconds_per_round": m["seconds_per_round"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--methods", nargs="+", default=None)
    parser.add_argument("--dataset", default=None, help="default: fashion-mnist when installed, else digits")
    parser.add_argument("--model", default="cnn4", choices=["cnn4", "mlp"],
                        help="cnn4: PFLlib's CNN (the protocol); mlp: the MLP 64-64 of configs/leaderboard_fmnist.yaml")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    dataset = args.dataset or ("fashion-mnist" if FMNIST.is_dir() else "digits")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods or personalised_methods():
            try:
                row = {**one(method, dataset, args.rounds, Path(tmp), args.model), "model": args.model}
            except Exception as err:  # one method's failure is reported, the others still run
                row = {"method": method, "dataset": dataset, "error": f"{type(err).__name__}: {err}"}
            rows.append(row)
            print(json.dumps(row), flush=True)
    base = next((r["seconds_per_round"] for r in rows if r["method"] == "fedavg" and "error" not in r), None)
    for r in rows:
        if base and r.get("seconds_per_round"):
            r["vs_fedavg"] = r["seconds_per_round"] / base
    if args.json:
        note = ("" if dataset == "fashion-mnist" else "digits with the same protocol (--dataset digits)"
                if FMNIST.is_dir() else "Fashion-MNIST is not installed: digits with the same protocol")
        print(json.dumps({"rows": rows, "note": note}, indent=1))


if __name__ == "__main__":
    main()
