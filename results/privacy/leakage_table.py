"""The table of leakage against accuracy (#76) from the sweeps of ``leakage_digits.sh`` (and ``leakage_fmnist.sh``):
one sweep per defence (its folder), each over ``leakage.kind``; every cell the mean ± 95 % CI over the sweep's seeds
(Student t).

    python results/privacy/leakage_table.py results/privacy/leakage_digits > results/privacy/leakage_digits.md
    python results/privacy/leakage_table.py results/privacy/leakage_flower dlg > results/privacy/leakage_flower.md

A second argument names the attack of sweeps that set ``leakage.kind`` instead of gridding it. Columns no row fills
are left out.
"""

from __future__ import annotations

import csv
import math
import sys
from pathlib import Path

#: (column title, grid point's leakage.kind — None: any, the runs train alike whatever the attack —, metric)
COLUMNS = [
    ("ε client", None, "epsilon"),
    ("ε record (worst)", None, "record_epsilon"),
    ("personal acc.", None, "best.local_accuracy_mean"),
    ("server acc.", None, "best.global_accuracy"),
    ("MI AUC server", "loss_threshold", "leakage.global_auc"),
    ("MI AUC personal", "loss_threshold", "leakage.personal_auc"),
    ("MI TPR@1%FPR personal", "loss_threshold", "leakage.personal_tpr_at_1pct_fpr"),
    ("LiRA AUC server", "lira", "leakage.global_auc"),
    ("LiRA AUC personal", "lira", "leakage.personal_auc"),
    ("LiRA TPR@1%FPR personal", "lira", "leakage.personal_tpr_at_1pct_fpr"),
    ("DLG PSNR dB", "dlg", "leakage.psnr"),
    ("DLG SSIM", "dlg", "leakage.ssim"),
    ("DLG labels", "dlg", "leakage.labels_recovered"),
    ("DLG update of clients", "dlg", "leakage.clients_in_update"),
]
ORDER = ["fedsgd_1_step", "none", "dp_z0.5", "dp_sgd_s1", "qsgd_2bit", "topk_10pct", "local_epochs_5",
         "one_client_a_node", "four_clients_a_node", "secaggplus"]


def cells(folder: Path, kind: str | None) -> dict[tuple[str, str, str], str]:
    out = {}
    with open(folder / "sweep.csv") as fh:
        for row in csv.DictReader(fh):
            mean, ci = float(row["mean"]), float(row["ci95"]) if row["ci95"] else math.nan
            text = f"{mean:.3f}" if math.isnan(ci) else f"{mean:.3f} ± {ci:.3f}"
            out[(row.get("leakage.kind") or str(kind), row["method"], row["metric"])] = text
    return out


def main(root: Path, kind: str | None = None) -> None:
    defences = [d for d in ORDER if (root / d / "sweep.csv").exists()]
    found = {d: cells(root / d, kind) for d in defences}
    columns = [c for c in COLUMNS if any(_cell(f, m, c) != "–" for f in found.values() for _, m, _ in f)]
    print(f"# Leakage against accuracy ({root.name})\n")
    print("Mean ± 95 % CI over 3 seeds; accuracy and membership of the model chosen by validation; DLG on client 0's "
          "round-1 upload. `–`: not measured for that row (no whole server model, or no model of the client's "
          "own; DLG's numbers sit on a method's federated row).\n")
    print("| defence | method | " + " | ".join(c[0] for c in columns) + " |")
    print("|" + "---|" * (len(columns) + 2))
    for defence in defences:
        methods = list(dict.fromkeys(m for _, m, _ in found[defence] if m != "(data)"))
        for method in methods:
            print(f"| {defence} | {method} | " + " | ".join(_cell(found[defence], method, c) for c in columns) + " |")


def _cell(found: dict[tuple[str, str, str], str], method: str, column: tuple[str, str | None, str]) -> str:
    _, kind, metric = column
    if kind is not None:
        return found.get((kind, method, metric), "–")
    return next((found[(k, method, metric)] for k in ("loss_threshold", "lira", "dlg") if (k, method, metric) in found),
                "–")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
