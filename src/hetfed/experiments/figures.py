"""Figures people compare: partitions, learning curves, sweep curves.

Matplotlib with the non-interactive Agg backend, so figures render headless.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def save(fig, path: str | Path, dpi: int = 110) -> Path:
    """Write a figure (creating its folder) and free it."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out


def plot_partition(fed, path: str | Path, seed: int = 0) -> Path:
    """Client × class heat map, and the 2-D PCA view of the samples coloured by client."""
    from hetfed.partition import pca_view

    counts = fed.class_counts()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5))
    im = ax1.imshow(counts, aspect="auto", cmap="viridis")
    ax1.set_xlabel("class")
    ax1.set_ylabel("client")
    ax1.set_title("samples per client and class")
    fig.colorbar(im, ax=ax1)
    z = pca_view(fed.x, 2, seed=seed)
    owner = np.full(len(fed.y), -1)
    for k in range(fed.n_clients):
        owner[fed.client_indices(k)] = k
    held = owner >= 0
    sc = ax2.scatter(z[held, 0], z[held, 1], c=owner[held], cmap="tab20", s=4, alpha=0.7)
    ax2.set_title("PCA of the features, coloured by client")
    ax2.set_xlabel("PC 1")
    ax2.set_ylabel("PC 2")
    if fed.n_clients <= 20:
        fig.colorbar(sc, ax=ax2, label="client")
    return save(fig, path)


def plot_learning_curves(curves: dict[str, dict[str, list[tuple[int, float]]]], path: str | Path) -> Path:
    """One panel per metric; one line per method. ``curves[metric][method] = [(round, v)]``."""
    metrics = list(curves)
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics), 4), squeeze=False)
    for ax, metric in zip(axes[0], metrics, strict=True):
        for method, points in curves[metric].items():
            if points:
                r, v = zip(*points, strict=True)
                ax.plot(r, v, label=method)
        ax.set_xlabel("round")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
        ax.legend()
    return save(fig, path)


def grid_order(value: object) -> tuple[int, float | str]:
    """Sort key for grid values of mixed kinds: numbers by value, then the rest by spelling."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, float(value))
    return (1, str(value))


def plot_sweep(table: list[dict], key: str, metric: str, path: str | Path) -> Path:
    """Metric vs a swept key, one line per method, with 95% CI bands."""
    fig, ax = plt.subplots(figsize=(6, 4))
    methods = sorted({row["method"] for row in table})
    for method in methods:
        rows = sorted((r for r in table if r["method"] == method and r["metric"] == metric), key=lambda r: grid_order(r[key]))
        if not rows:
            continue
        xs = [r[key] for r in rows]
        mean = np.array([r["mean"] for r in rows])
        ci = np.array([r["ci95"] for r in rows])
        ax.plot(xs, mean, marker="o", label=method)
        ax.fill_between(xs, mean - ci, mean + ci, alpha=0.2)
    ax.set_xlabel(key)
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend()
    return save(fig, path)


def plot_mean_curves(curves: dict[str, list[list[tuple[int, float]]]], metric: str, path: str | Path) -> Path:
    """Mean (± 95% CI band) learning curve over seeds, one line per label."""
    from hetfed.experiments.sweep import ci95

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for label, runs in sorted(curves.items()):
        rounds = sorted({r for run in runs for r, _ in run})
        by_round = [[v for run in runs for r2, v in run if r2 == r] for r in rounds]
        mean = np.array([np.mean(v) for v in by_round])
        band = np.array([ci95(v) for v in by_round])
        ax.plot(rounds, mean, label=label)
        ax.fill_between(rounds, mean - band, mean + band, alpha=0.15)
    ax.set_xlabel("round")
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, path)


def plot_global_vs_local(table: list[dict], key: str, path: str | Path) -> Path:
    """FedMoE Fig. 3: best global vs local accuracy, one point per grid value, per method."""
    fig, ax = plt.subplots(figsize=(6, 5))
    methods = sorted({r["method"] for r in table if r["method"] != "(data)"})
    for method in methods:
        local = {r[key]: r["mean"] for r in table if r["method"] == method and r["metric"] == "best.local_accuracy_mean"}
        glob = {r[key]: r["mean"] for r in table if r["method"] == method and r["metric"] == "best.global_accuracy"}
        keys = sorted(set(local) & set(glob), key=grid_order)
        ax.plot([local[k] for k in keys], [glob[k] for k in keys], marker="o", label=method)
        for k in keys:
            ax.annotate(str(k), (local[k], glob[k]), fontsize=7, alpha=0.7)
    ax.set_xlabel("local test accuracy (mean over clients)")
    ax.set_ylabel("global test accuracy (mean over clients)")
    ax.grid(alpha=0.3)
    ax.legend()
    return save(fig, path)


def plot_relative(table: list[dict], key: str, metric: str, baseline: str, path: str | Path) -> Path:
    """FedMoE Fig. 5: a metric as a fraction of a baseline method's, vs a swept key."""
    fig, ax = plt.subplots(figsize=(6, 4))
    base = {r[key]: r["mean"] for r in table if r["method"] == baseline and r["metric"] == metric}
    for method in sorted({r["method"] for r in table if r["method"] not in ("(data)",)}):
        vals = {r[key]: r["mean"] for r in table if r["method"] == method and r["metric"] == metric}
        keys = sorted((k for k in vals if base.get(k)), key=grid_order)
        ax.plot(keys, [vals[k] / base[k] for k in keys], marker="o", label=method)
    ax.set_xscale("log" if all(isinstance(k, int | float) and k > 0 for k in base) else "linear")
    ax.set_xlabel(key)
    ax.set_ylabel(f"{metric} / {baseline}'s")
    ax.grid(alpha=0.3)
    ax.legend()
    return save(fig, path)
