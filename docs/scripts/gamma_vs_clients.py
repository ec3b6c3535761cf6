"""The figure in docs/heterogeneity.md: Γ and Γ − Γ_IID against the client count.

For an IID split and a label-skewed split (label-sorted shards, 2 per client) of
digits and Fashion-MNIST into 10 … 1000 clients, Γ is measured on the clients'
training data with its size-matched IID reference (3 draws). Writes
docs/figures/gamma_vs_clients.{png,svg,csv}.

    python docs/scripts/gamma_vs_clients.py
"""

from __future__ import annotations

import csv
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from hetfed.config import build_config  # noqa: E402
from hetfed.pipeline import prepare  # noqa: E402

OUT = Path(__file__).resolve().parents[1] / "figures"
SETTINGS = {
    "digits": [10, 30, 100, 300],
    "fashion-mnist": [10, 30, 100, 300, 1000],
}
PARTITIONS = {"iid": {"kind": "iid"}, "shards (2 per client)": {"kind": "shards", "shards_per_client": 2}}


def main() -> None:
    rows = []
    for dataset, counts in SETTINGS.items():
        for label, part in PARTITIONS.items():
            for k in counts:
                t0 = time.perf_counter()
                cfg = build_config({"dataset": {"name": dataset},
                                    "partition": {**part, "clients": k, "min_size": 1}})
                h = prepare(cfg, progress=False).heterogeneity
                rows.append({"dataset": dataset, "partition": label, "clients": k, "gamma": h.gamma,
                             "gamma_iid": h.gamma_iid, "gamma_iid_sd": h.gamma_iid_sd, "gamma_excess": h.gamma_excess,
                             "seconds": time.perf_counter() - t0})
                print(rows[-1], flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "gamma_vs_clients.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    colours = {"iid": "#0072B2", "shards (2 per client)": "#D55E00"}
    fig, axes = plt.subplots(2, len(SETTINGS), figsize=(11, 7), sharex="col")
    for j, dataset in enumerate(SETTINGS):
        for label in PARTITIONS:
            sel = [r for r in rows if r["dataset"] == dataset and r["partition"] == label]
            ks = [r["clients"] for r in sel]
            axes[0, j].plot(ks, [r["gamma"] for r in sel], marker="o", color=colours[label], label=label)
            axes[0, j].plot(ks, [r["gamma_iid"] for r in sel], ls=":", color=colours[label], alpha=0.7,
                            label=f"{label}: Γ_IID (same sizes)")
            axes[1, j].errorbar(ks, [r["gamma_excess"] for r in sel], yerr=[r["gamma_iid_sd"] for r in sel],
                                marker="o", color=colours[label], capsize=3, label=label)
        axes[0, j].set_title(f"{dataset}: raw Γ grows with the client count")
        axes[1, j].set_title(f"{dataset}: Γ − Γ_IID separates skew from size")
        axes[1, j].axhline(0, color="grey", lw=0.8)
        for i in range(2):
            axes[i, j].set_xscale("log")
            axes[i, j].grid(alpha=0.3)
        axes[1, j].set_xlabel("number of clients (log scale)")
    axes[0, 0].set_ylabel("Γ (mean Fréchet distance, client vs rest)")
    axes[1, 0].set_ylabel("Γ − Γ_IID")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    for ext in ("png", "svg"):
        fig.savefig(OUT / f"gamma_vs_clients.{ext}", dpi=110)
    print(f"written {OUT / 'gamma_vs_clients.png'}")


if __name__ == "__main__":
    main()
