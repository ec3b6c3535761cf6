"""FedMoE's Table 1 on Fashion-MNIST by the paper's protocol, from the per-p sweep folders' runs.csv.

    python results/paper/fedmoe_table1.py [FOLDER …]    # default: every results/paper/fedmoe_fmnist/p*/
    python results/paper/fedmoe_table1.py --key partition.opt_out results/paper/fedmoe_fmnist/optout_p0.8  # Fig. 6
    python results/paper/fedmoe_table1.py --key partition.alpha results/paper/fedmoe_fmnist/alpha  # Fig. 5

One row per value of the swept key (default p, the majority fraction; Fig. 6 sweeps the opted-out fraction q, Fig. 5
the Dirichlet concentration α) and test set — the balanced global test set (``global_accuracy``) and each evaluated
client's own test data (``local_accuracy_mean``): the four models' means over seeds (FedAvg at its early-stopped
best round by validation; Local, fine-tuned and the mixture trained once after it), then the paired differences
the paper's claims rest on, [95% CI] and the seeds the mixture won: mixture − fine-tuned (the headline on the
global test set) and mixture − Local (on the clients' own data). Generated, never typed: a test compares it with
results/paper/README.md.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from hetfed.analysis.fidelity import load_runs, per_seed
from hetfed.analysis.paired import paired_by_seed

HERE = Path(__file__).parent
FOLDERS = sorted((HERE / "fedmoe_fmnist").glob("p*/runs.csv"))
MODELS = ("fedavg", "local", "finetuned", "mixture")
TESTS = (("global", "best.global_accuracy"), ("own", "best.local_accuracy_mean"))


def _num(x: float) -> str:
    return f"{x:+.3f}".replace("-", "−")


def _delta(a: dict, b: dict) -> str:
    """a − b paired over the seeds both have ({seed: value} maps), as the table prints it."""
    r = paired_by_seed(a, b)
    return f"{_num(r.mean)} [{_num(r.ci_low)}, {_num(r.ci_high)}], {r.wins}/{r.n}"


#: the column each swept key is shown under
LABELS = {"partition.p": "p", "partition.opt_out": "q", "partition.alpha": "α"}


def table(folders: list[Path] | None = None, key: str = "partition.p") -> str:
    folders = [f.parent for f in FOLDERS] if folders is None else folders
    lines = [f"| {LABELS.get(key, key)} | test set | seeds | FedAvg | Local | fine-tuned | mixture | mixture − "
             "fine-tuned "
             "| mixture − Local |",
             "|---|---|---|---|---|---|---|---|---|"]
    points = []
    for folder in folders:
        rows = load_runs(folder)
        points += [(float(v), v, rows) for v in {r[key] for r in rows if r["method"] == "mixture"}]
    for _, value, rows in sorted(points, key=lambda t: t[0]):
        point = {key: value}
        for name, metric in TESTS:
            per_model = {model: per_seed(rows, model, metric, point) for model in MODELS}
            means = [f"{np.mean(list(per_model[model].values())):.3f}" for model in MODELS]
            n = len(per_model["mixture"])
            lines.append(f"| {value} | {name} | {n} | " + " | ".join(means) + " | "
                         + _delta(per_model["mixture"], per_model["finetuned"]) + " | "
                         + _delta(per_model["mixture"], per_model["local"]) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python results/paper/fedmoe_table1.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("folders", nargs="*", type=Path, metavar="FOLDER", help="results folders (default: "
                                                                            "fedmoe_fmnist/p*)")
    ap.add_argument("--key", default="partition.p", help="the swept key, one row per value (default partition.p)")
    args = ap.parse_args(argv)
    for folder in args.folders:
        if not (folder / "runs.csv").is_file():
            ap.error(f"folder {str(folder)!r} has no runs.csv: expected a results folder that hetfed sweep wrote")
    print(table(args.folders or None, args.key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
