"""Γ of Shakespeare's natural federation next to Dirichlet re-partitions of the same samples (#27).

    python results/shakespeare/gamma.py OUT_DIR   # runs hetfed partition for each row (~35 s each on the
                                                  # full corpus, ~4 s on the 4-play subset), one thread
    python results/shakespeare/gamma.py OUT_DIR --plot-only   # redraws gamma.png from gamma.csv

Writes OUT_DIR/gamma.csv, gamma.md and gamma.png. Γ is measured on each window's bag of characters
(80-d character frequencies, hetfed.data.shakespeare.character_histograms), on the clients' train parts.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

SETTINGS = {
    "4 plays, every 8th window (configs/shakespeare.yaml)": [],
    "all 36 plays, every window (LEAF)": ["--set", "dataset.plays=null", "--set", "dataset.window_stride=1"],
}
_AT_LEAST_20 = ["--set", "partition.min_size=20"]
PARTITIONS = {
    "roles (natural)": ["--set", "partition.kind=natural"],
    # Dirichlet's rows keep every client at ≥ 20 windows (its ``min_size``; the roles' and IID's rows never took it)
    "Dirichlet α = 0.1": ["--set", "partition.kind=dirichlet", "--set", "partition.alpha=0.1", *_AT_LEAST_20],
    "Dirichlet α = 1": ["--set", "partition.kind=dirichlet", "--set", "partition.alpha=1", *_AT_LEAST_20],
    "Dirichlet α = 10": ["--set", "partition.kind=dirichlet", "--set", "partition.alpha=10", *_AT_LEAST_20],
    "IID": ["--set", "partition.kind=iid"],
}


def partition(extra: list[str]) -> dict:
    out = subprocess.run(["hetfed", "partition", "configs/shakespeare.yaml", "--json", *extra], capture_output=True,
                         text=True, check=True,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    return json.loads(out.stdout)


def main(out_dir: str, plot_only: bool = False) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if plot_only:  # redraw gamma.png from gamma.csv
        with open(out / "gamma.csv", newline="") as fh:
            plot([{k: (v if k in ("data", "partition") else float(v)) for k,
                   v in r.items()} for r in csv.DictReader(fh)],
                 out)
        return
    rows = []
    for setting, base in SETTINGS.items():
        roles = None
        for name, extra in PARTITIONS.items():
            sized = [] if roles is None else ["--set", f"partition.clients={roles}"]  # as many clients as roles
            d = partition([*base, *extra, *sized])
            roles = roles or d["n_clients"]
            rows.append({"data": setting, "partition": name, "clients": d["n_clients"], "gamma": d["gamma"],
                         "gamma_iid": d["gamma_iid"], "delta_gamma": d["gamma_excess"],
                         "ratio": d["gamma"] / d["gamma_iid"], "label_emd": d["label_emd_mean"]})
            print(rows[-1], flush=True)
    with open(out / "gamma.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = ["| data | partition | clients | Γ | Γ_IID | ΔΓ | Γ / Γ_IID | label EMD |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['data']} | {r['partition']} | {r['clients']} | {r['gamma']:.3g} | {r['gamma_iid']:.3g} | "
              f"{r['delta_gamma']:.3g} | {r['ratio']:.2f} | {r['label_emd']:.3f} |" for r in rows]
    (out / "gamma.md").write_text("\n".join(lines) + "\n")
    plot(rows, out)


def plot(rows: list[dict], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    names = list(PARTITIONS)
    for i, setting in enumerate(SETTINGS):
        sub = [r for r in rows if r["data"] == setting]
        xs = [j + (i - 0.5) * 0.38 for j in range(len(names))]
        axes[0].bar(xs, [max(r["delta_gamma"], 1e-9) for r in sub], width=0.36, label=setting)
        for x, r in zip(xs, sub, strict=True):
            if r["delta_gamma"] <= 0:  # a log axis cannot show it: say so on the bar
                axes[0].text(x, 1.5e-9, "≤ 0", ha="center", fontsize=8)
        axes[1].bar(xs, [r["label_emd"] for r in sub], width=0.36, label=setting)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("ΔΓ = Γ − Γ_IID (bag of characters, log)")
    axes[1].set_ylabel("mean label EMD to the pooled labels (0 … 2)")
    for ax in axes:
        ax.set_xticks(range(len(names)), names, rotation=20, ha="right")
    axes[0].set_title("feature heterogeneity (ΔΓ)")
    axes[1].set_title("label skew (next character)")
    axes[1].legend(fontsize=8)
    fig.suptitle("Shakespeare: the natural role federation vs Dirichlet re-partitions of the same windows")
    fig.tight_layout()
    fig.savefig(out / "gamma.png", dpi=110)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--plot-only"]
    main(args[0] if args else "results/shakespeare", plot_only="--plot-only" in sys.argv)
