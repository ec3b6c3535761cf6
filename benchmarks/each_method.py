"""A config's methods in a stacked sweep, run whole (one method's runs at a time) against ``--each-method`` (every
method's runs side by side), in one process (#74 §1: "runs of different methods share a call wherever their steps
match").

Both sweeps stack the same runs; whole, each run trains its methods one after another, so a round's stack holds one
method's runs; apart, a round holds every method's runs, and those whose step (FedAvg's, kNN-Per's) or evaluation
(every method whose clients score the model sent: FedAvg, FedProx, SCAFFOLD, FedDyn …) is the same computation
share one call. Each sweep is timed whole (wall seconds, its preparation included), alternated ``--repeats`` times;
JSON out with each one's times, their medians' ratio and the largest difference between the two runs.csv (the
validation losses to float32's tolerance, every other value equal). Timings are never asserted.

    python benchmarks/each_method.py [--methods fedavg,fedprox,scaffold,feddyn] [--seeds 5] [--rounds 40]
                                     [--repeats 2] [--set KEY=VALUE ...]

The default setting is #74's CPU one (logistic regression on digits, 10 Dirichlet-0.5 clients, evaluation every
round); ``--set`` overrides it. ``--methods config`` times the default experiment itself (its ReLU MLP and CGAU on
feature clusters).
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

from hetfed.cli import main as cli

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"
SETTING = ["model.kind=logreg", "partition.kind=dirichlet", "partition.alpha=0.5", "train.eval_every=1",
           "train.checkpoint_every=null"]


def timed(args: list[str], out: Path) -> float:
    t0 = time.perf_counter()
    assert cli([*args, "--out", str(out)]) == 0, (out / "sweep.json").read_text()
    return time.perf_counter() - t0


def runs(out: Path) -> dict[tuple[str, ...], float]:
    return {(r["seed"], r["method"], r["metric"]): float(r["value"]) for r in csv.DictReader((out / "runs.csv").open())
            if "seconds" not in r["metric"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--methods", default="fedavg,fedprox,scaffold,feddyn",
                    help="the config's methods (algorithms); 'config': the config's own (relu and cgau)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    a = ap.parse_args()
    warnings.filterwarnings("ignore")
    names = ["relu", "cgau"] if a.methods == "config" else a.methods.split(",")
    methods = "[" + ", ".join(f"{{name: {m}, algorithm: {m}}}" for m in names) + "]"
    own = a.methods == "config"  # the default experiment as it is (its ReLU MLP and CGAU, feature clusters)
    sets = ["train.checkpoint_every=null", *a.sets] if own else [*SETTING, f"methods={methods}", *a.sets]
    args = ["sweep", str(CONFIG), *[x for s in sets for x in ("--set", s)], "--seeds", str(a.seeds), "--stack",
            "--quiet", "--no-report"]
    times: dict[str, list[float]] = {"whole": [], "each_method": []}
    with tempfile.TemporaryDirectory() as tmp:
        timed([*args, "--set", "train.rounds=1"], Path(tmp) / "warm-up")  # the data loaded, the code warm
        args += ["--set", f"train.rounds={a.rounds}"]
        for i in range(a.repeats):
            times["whole"].append(timed(args, Path(tmp) / f"whole{i}"))
            times["each_method"].append(timed([*args, "--each-method"], Path(tmp) / f"each{i}"))
        whole, each = runs(Path(tmp) / "whole0"), runs(Path(tmp) / "each0")
    assert whole.keys() == each.keys()
    differ = max((abs(each[k] - v) / max(abs(v), 1e-12) for k, v in whole.items()), default=0.0)
    medians = {k: statistics.median(v) for k, v in times.items()}
    print(json.dumps({"methods": names, "seeds": a.seeds, "rounds": a.rounds, "overrides": a.sets,
                      "runs_whole": a.seeds, "runs_each_method": a.seeds * len(names),
                      "whole_s": [round(t, 2) for t in times["whole"]],
                      "each_method_s": [round(t, 2) for t in times["each_method"]],
                      "whole_over_each_method": round(medians["whole"] / medians["each_method"], 3),
                      "largest_relative_difference_runs_csv": differ}, indent=1))


if __name__ == "__main__":
    main()
