"""The tables of results/agnostic_fmnist/README.md from a sweep's directory: each class's (client's) accuracy at the
round chosen by validation, mean ± 95 % CI over the seeds, then each method paired with FedAvg on the same seeds.

    python results/agnostic_fmnist/table.py SWEEP_DIR                           # writes SWEEP_DIR/per_class.csv too
    python results/agnostic_fmnist/table.py results/agnostic_fmnist/per_class.csv  # the tables from the kept rows
"""

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

#: client k holds class k of dataset.keep_classes (pathological, one class a client, first-deterministic)
CLIENTS = {"0": "T-shirt/top", "1": "Pullover", "2": "Shirt"}


def mean_ci(values) -> tuple[float, float]:
    x = np.asarray(values, dtype=float)
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)) if len(x) > 1 else float("nan")
    return float(x.mean()), float(half)


def run_rows(summary_path: Path) -> list[dict]:
    """Every method's per-client accuracies at its best round, its worst and mean, and its λ after the last round."""
    summary = json.loads(summary_path.read_text())
    metrics = pd.read_csv(summary_path.parent / "metrics.csv", dtype={"client": str})
    rows = []
    for method, m in summary["methods"].items():
        at = metrics[(metrics.method == method) & (metrics["round"] == m["best_round"]) & (metrics.split == "client")
                     & (metrics.metric == "local_accuracy")]
        row = {"seed": summary["seed"], "method": method, "best_round": m["best_round"],
               **{CLIENTS[c]: v for c, v in zip(at.client, at.value, strict=True)},
               "worst": m["best"]["local_accuracy_worst10"], "mean": m["best"]["local_accuracy_mean"],
               "global": m["best"]["global_accuracy"]}
        row.update({k: v for k, v in (m.get("findings") or {}).items()})
        rows.append(row)
    return rows


def main(source: str) -> None:
    if source.endswith(".csv"):
        table = pd.read_csv(source)
    else:  # a sweep's run folders: every run's rows, kept beside them
        table = pd.DataFrame([r for p in sorted(Path(source).glob("*/seed=*/summary.json")) for r in run_rows(p)])
        table.to_csv(Path(source) / "per_class.csv", index=False)
    methods = list(dict.fromkeys(table.method))
    columns = [*CLIENTS.values(), "worst", "mean", "global"]
    print("| best by validation | " + " | ".join(methods) + " |")
    for col in columns:
        cells = [mean_ci(table[table.method == m].sort_values("seed")[col]) for m in methods]
        print(f"| {col} | " + " | ".join(f"{a:.3f} ± {h:.3f}" for a, h in cells) + " |")
    print("\nbest_round", {m: table[table.method == m].sort_values("seed").best_round.tolist() for m in methods})
    for m in methods:
        lam = table[table.method == m]
        if "lambda_max" in lam and lam.lambda_max.notna().any():
            print(f"{m}: λ after the last round: max {lam.lambda_max.mean():.3f}, min {lam.lambda_min.mean():.3f}, "
                  f"top client {lam.lambda_top_client.tolist()}, effective clients {lam.lambda_clients.mean():.2f}")
    base = table[table.method == "fedavg"].sort_values("seed")
    for col in ("worst", "Shirt", "mean"):
        for m in methods[1:]:
            d = table[table.method == m].sort_values("seed")[col].to_numpy() - base[col].to_numpy()
            a, h = mean_ci(d)
            print(f"{col} {m}: Δ {a:+.3f} [{a - h:+.3f}, {a + h:+.3f}] won {(d > 0).sum()}/{len(d)}")


if __name__ == "__main__":
    main(sys.argv[1])
