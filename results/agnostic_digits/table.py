"""The tables of results/agnostic_digits/README.md from a sweep's runs.csv: mean ± 95 % CI over the seeds, then each
method paired with FedAvg on the same seeds.

    python results/agnostic_digits/table.py SWEEP_DIR
"""

import sys

import numpy as np
import pandas as pd
from scipy import stats

METRICS = ("local_accuracy_worst10", "local_accuracy_mean", "local_accuracy_std", "global_accuracy")


def mean_ci(values) -> tuple[float, float]:
    x = np.asarray(values, dtype=float)
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)) if len(x) > 1 else float("nan")
    return float(x.mean()), float(half)


def values(runs: pd.DataFrame, method: str, metric: str) -> np.ndarray:
    return runs[(runs.method == method) & (runs.metric == metric)].sort_values("seed").value.to_numpy()


def main(directory: str) -> None:
    runs = pd.read_csv(f"{directory}/runs.csv")
    runs = runs[runs.method != "(data)"]
    methods = list(dict.fromkeys(runs.method))
    for which in ("best", "final"):
        print(f"\n{which}: | metric | " + " | ".join(methods) + " |")
        for metric in METRICS:
            cells = [mean_ci(values(runs, m, f"{which}.{metric}")) for m in methods]
            print(f"| {metric} | " + " | ".join(f"{a:.3f} ± {h:.3f}" for a, h in cells) + " |")
    print("\nbest_round", {m: values(runs, m, "best_round").tolist() for m in methods})
    for metric in ("local_accuracy_worst10", "local_accuracy_mean"):
        base = values(runs, "fedavg", f"best.{metric}")
        for m in methods[1:]:
            d = values(runs, m, f"best.{metric}") - base
            a, h = mean_ci(d)
            print(f"best {metric} {m}: Δ {a:+.3f} [{a - h:+.3f}, {a + h:+.3f}] won {(d > 0).sum()}/{len(d)}")


if __name__ == "__main__":
    main(sys.argv[1])
