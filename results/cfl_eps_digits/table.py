"""The table of results/cfl_eps_digits/README.md from a sweep's runs.csv: per partition and method, the clients'
local accuracy at the round chosen by validation, the last round's clusters and their adjusted Rand index against the
concepts (mean ± 95 % CI over the seeds), and each CFL paired with FedAvg on the same seeds.

    python results/cfl_eps_digits/table.py results/cfl_eps_digits/runs.csv
"""

import sys

import numpy as np
import pandas as pd
from scipy import stats

COLUMNS = ("best.local_accuracy_mean", "findings.clusters", "findings.cluster_ari")


def mean_ci(values) -> str:
    x = np.asarray(values, dtype=float)
    if not len(x):
        return "–"
    half = stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x)) if len(x) > 1 else float("nan")
    return f"{x.mean():.3f} ± {half:.3f}"


def main(path: str) -> None:
    runs = pd.read_csv(path)
    runs = runs[runs.method != "(data)"]
    for partition, part in runs.groupby("partition", sort=False):
        print(f"\n{partition}")
        for method, rows in part.groupby("method", sort=False):
            cells = [mean_ci(rows[rows.metric == c].sort_values("seed").value) for c in COLUMNS]
            line = f"| {method} | " + " | ".join(cells) + " |"
            if method != "fedavg":
                mine = rows[rows.metric == COLUMNS[0]].sort_values("seed").value.to_numpy()
                base = part[(part.method == "fedavg") & (part.metric == COLUMNS[0])].sort_values("seed").value
                d = mine - base.to_numpy()
                line += f" Δ {mean_ci(d)} won {(d > 0).sum()}/{len(d)}"
            print(line)


if __name__ == "__main__":
    main(sys.argv[1])
