"""The Fed-FSNet sensitivity table of results/paper/README.md, from the folders' runs.csv.

    python results/paper/fsnet_sensitivity.py

Rows: one change from the paper's stated protocol each; cells: global accuracy best by validation / last round
(mean over seeds); Δ: paired Fed-FSNet − FedAvg, best by validation, [95% CI], seeds Fed-FSNet won. Then one line
on how the gain depends on the strength of the lower bound, over every (setting, seed) pair.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hetfed.analysis.fidelity import load_runs, per_seed
from hetfed.analysis.paired import paired_by_seed

HERE = Path(__file__).parent
S = HERE / "fsnet_sensitivity_mnist"

#: Table 1 of the paper, MNIST, f = 0.1: FedAvg on the shards, and Fed-FSNet − FedAvg
PAPER_LOWER, PAPER_GAIN = 0.371, 0.444

#: (label, IID folder and point, shards folder) — None where the setting has no such run
ROWS = [
    ("the paper's, as stated (lr 0.01, 2 shards per client)", (HERE / "fsnet_mnist/iid", None),
     HERE / "fsnet_mnist/shards"),
    ("lr 0.05", (S / "iid_lr", ("train.optimizer.lr", 0.05)), None),
    ("lr 0.1", (S / "iid_lr", ("train.optimizer.lr", 0.1)), S / "lr_0.1"),
    ("SGD momentum 0.9", (S / "iid_momentum_0.9", None), S / "momentum_0.9"),
    ("shards cut from the label-sorted pool (straddling classes)", None, S / "sorted_shards"),
    ("**one class per client** (100 shards, 1 each)", None, S / "one_class"),
    ("one class per client, lr 0.1", None, S / "one_class_lr_0.1"),
    ("the LeNet-style CNN (`model.kind: cnn`) instead of the MLP", (S / "iid_cnn", None), S / "cnn"),
]


def load(folder: Path, point: tuple[str, float] | None = None) -> dict[tuple[str, str], dict[int, float]]:
    """(method, metric) → {seed: value} of a results folder's runs.csv, at one grid point if given."""
    rows = load_runs(folder)
    where = dict([point]) if point else {}
    return {k: v for k in {(r["method"], r["metric"]) for r in rows} if (v := per_seed(rows, *k, where))}


def cell(d: dict, method: str) -> str:
    best, last = d.get((method, "best.global_accuracy")), d.get((method, "final.global_accuracy"))
    return f"{np.mean(list(best.values())):.3f} / {np.mean(list(last.values())):.3f}" if best else "-"


def delta(d: dict) -> str:
    a, b = d[("fsnet", "best.global_accuracy")], d[("fedavg", "best.global_accuracy")]
    r = paired_by_seed(a, b)
    return f"{r.mean:+.3f} [{r.ci_low:+.3f}, {r.ci_high:+.3f}], {r.wins}/{r.n}"


def table() -> str:
    lines = ["| setting (one change from the paper's) | FedAvg IID | FedAvg shards | Fed-FSNet shards | Δ | seeds |",
             "|---|---|---|---|---|---|"]
    for label, iid, shards in ROWS:
        if shards is not None and not (shards / "runs.csv").is_file():
            continue
        i = cell(load(*iid), "fedavg") if iid else "-"
        d = load(shards) if shards else None
        n = len(d[("fedavg", "best.global_accuracy")]) if d else len(load(*iid)[("fedavg", "best.global_accuracy")])
        lines.append(f"| {label} | {i} | {cell(d, 'fedavg') if d else '-'} | {cell(d, 'fsnet') if d else '-'} "
                     f"| {delta(d) if d else '-'} | {n} |")
    return "\n".join(lines) + "\n"


def gain_vs_bound() -> str:
    """How Fed-FSNet's gain depends on the strength of the lower bound, over every (setting, seed) of the shard
    rows: Spearman's ρ between FedAvg's accuracy (best by validation) and the paired gain, and the least-squares
    slope (gain per unit of FedAvg accuracy). Pools settings, so it describes this study, not a causal law."""
    from scipy.stats import linregress, spearmanr

    bound, gain = [], []
    for _, _, shards in ROWS:
        if shards is None or not (shards / "runs.csv").is_file():
            continue
        d = load(shards)
        a, b = d[("fsnet", "best.global_accuracy")], d[("fedavg", "best.global_accuracy")]
        for s in sorted(set(a) & set(b)):
            bound.append(b[s])
            gain.append(a[s] - b[s])
    rho = spearmanr(bound, gain)
    fit = linregress(bound, gain)
    return (f"Over the {len(bound)} (setting, seed) pairs of the shard rows: Spearman ρ(FedAvg accuracy, Fed-FSNet − "
            "FedAvg) "
            f"= {rho.statistic:+.2f} (p = {rho.pvalue:.2g}); least-squares gain = {fit.intercept:+.3f} "
            f"{fit.slope:+.3f} × FedAvg accuracy, which at the paper's lower bound ({PAPER_LOWER}) predicts a gain of "
            f"{fit.intercept + fit.slope * PAPER_LOWER:+.3f} (the paper's: {PAPER_GAIN:+.3f}).\n")


if __name__ == "__main__":
    print(table())
    print(gain_vs_bound())
