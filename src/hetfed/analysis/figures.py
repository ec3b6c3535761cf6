"""Figures people compare: partitions, learning curves, sweep curves.

Matplotlib with the non-interactive Agg backend, so figures render headless.
Every figure has a title and axes in words (:mod:`hetfed.analysis.plotstyle`),
the colour-blind-safe palette, legends outside the data, and is written as PNG
and SVG. Each ``plot_*`` returns the saved PNG's path, or the open figure when
``path`` is None (the report embeds it).
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from cycler import cycler  # noqa: E402  # matplotlib's own dependency
from matplotlib.ticker import MaxNLocator  # noqa: E402

from hetfed.analysis.plotstyle import PALETTE, key_label, metric_label, metric_range, style, tick_labels  # noqa: E402

plt.rcParams.update({"axes.prop_cycle": cycler(color=PALETTE), "svg.fonttype": "none"})


def save(fig, path: str | Path, dpi: int = 110) -> Path:
    """Write a figure as PNG and, beside it, SVG (creating the folder); free it."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.suffix.lower() != ".png":
        fig.savefig(out, dpi=dpi, bbox_inches="tight")
    else:  # both files cropped to one tight box, measured once (each "tight" save measures it anew: ~0.1 s a figure)
        box = _tight_box(fig, dpi)
        fig.savefig(out, dpi=dpi, bbox_inches=box)
        fig.savefig(out.with_suffix(".svg"), bbox_inches=box)
    plt.close(fig)
    return out


def _tight_box(fig, dpi: int):
    """The box ``savefig(bbox_inches="tight")`` crops to at ``dpi``, in inches, with its padding: the figure laid
    out and measured as that save does, without rendering it."""
    own = fig.dpi
    fig.set_dpi(dpi)
    try:
        fig.draw_without_rendering()
        box = fig.get_tightbbox(fig.canvas.get_renderer())
    finally:
        fig.set_dpi(own)  # the SVG's embedded images keep the figure's resolution, as before
    return box.padded(plt.rcParams["savefig.pad_inches"])


def finish(fig, path: str | Path | None):
    """Save to ``path`` (PNG + SVG), or hand back the figure when there is no path."""
    return fig if path is None else save(fig, path)


def png_bytes(fig, dpi: int = 96) -> bytes:
    """The figure as PNG bytes (closed afterwards), for embedding."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _legend(ax, n: int) -> None:
    """A legend beside the axes (never over the data); nothing for a single unnamed series."""
    if n:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)


def _clip(values: np.ndarray, metric: str) -> np.ndarray:
    lo, hi = metric_range(metric)
    return np.clip(values, -np.inf if lo is None else lo, np.inf if hi is None else hi)


# ------------------------------------------------------------------ the federation


def plot_partition(fed, path: str | Path | None, seed: int = 0):
    """Client × class heat map, and the 2-D PCA view of the samples coloured by client."""
    from hetfed.partition import partition_view

    return plot_partition_view(partition_view(fed, seed), path)


def plot_partition_view(view: dict[str, np.ndarray], path: str | Path | None):
    counts, xy, owner = view["counts"], view["xy"], view["owner"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 5))
    im = ax1.imshow(counts, aspect="auto", cmap="viridis", interpolation="nearest")
    ax1.set_xlabel("class")
    ax1.set_ylabel("client")
    ax1.set_title("samples per client and class (all splits)")
    fig.colorbar(im, ax=ax1, label="samples")
    n_clients = counts.shape[0]
    sc = ax2.scatter(xy[:, 0], xy[:, 1], c=owner, cmap="tab20" if n_clients <= 20 else "viridis", s=4, alpha=0.7)
    ax2.set_title("the samples' features (PCA), coloured by client")
    ax2.set_xlabel("principal component 1")
    ax2.set_ylabel("principal component 2")
    fig.colorbar(sc, ax=ax2, label="client")
    return finish(fig, path)


def plot_client_sizes(view: dict[str, np.ndarray], path: str | Path | None):
    """Samples per client, split into train / validation / test; opted-out clients hatched."""
    k = np.arange(len(view["train"]))
    fig, ax = plt.subplots(figsize=(min(12, 4 + 0.08 * len(k)), 3.6))
    bottom = np.zeros(len(k))
    for i, part in enumerate(("train", "val", "test")):
        ax.bar(k, view[part], bottom=bottom, color=PALETTE[i], width=0.9,
               label={"val": "validation"}.get(part, part))
        bottom += view[part]
    out = np.flatnonzero(view["opted_out"])
    if len(out):
        ax.bar(out, bottom[out], fill=False, hatch="//", edgecolor="0.3", width=0.9, label="opted out")
    ax.set_xlabel("client")
    ax.set_ylabel("samples")
    ax.set_title("samples per client")
    _legend(ax, 1)
    return finish(fig, path)


def plot_label_skew(view: dict[str, np.ndarray], path: str | Path | None):
    """Each client's label skew: Σ_c |p_k(c) − p(c)| (Zhao et al.'s EMD, 0 … 2) against the pooled labels."""
    from hetfed.heterogeneity import label_emd

    emd = label_emd(view["counts"])
    fig, ax = plt.subplots(figsize=(min(12, 4 + 0.08 * len(emd)), 3.2))
    ax.bar(np.arange(len(emd)), emd, color=PALETTE[0], width=0.9)
    ax.set_ylim(0, 2)
    ax.set_xlabel("client")
    ax.set_ylabel("label EMD to the pooled labels (0 … 2)")
    ax.set_title(f"label skew per client, all splits (mean {emd.mean():.3f})")
    return finish(fig, path)


# ------------------------------------------------------------------ one run


def plot_learning_curves(curves: Mapping[str, Mapping[str, Sequence[tuple[float, float]]]], path: str | Path | None,
                         best_rounds: dict[str, int | None] | None = None, xlabel: str = "round",
                         log_x: bool = False, shares: bool = False):
    """One panel per metric; one line per method; the round of the best model marked (★).

    ``curves[metric][method] = [(round, value)]`` — or ``(x, value)`` against another ``xlabel`` (simulated
    seconds, cumulative uplink bytes; no ★ then); metrics without points are left out. ``shares``: every metric is a
    share, drawn on 0…1 (a constant share otherwise fills its panel at an arbitrary scale).
    """
    metrics = [m for m in curves if any(curves[m].values())]
    if not metrics:
        metrics = list(curves)[:1]
    best_rounds = best_rounds or {}
    ncols = 2 if len(metrics) > 2 else len(metrics)
    nrows = math.ceil(len(metrics) / ncols)
    fig, grid = plt.subplots(nrows, ncols, figsize=(5.2 * ncols + 1.8, 3.8 * nrows), squeeze=False)
    axes = [list(grid.flat)]
    for ax in axes[0][len(metrics):]:
        ax.set_visible(False)
    methods = sorted({m for metric in metrics for m in curves[metric]})
    for ax, metric in zip(axes[0], metrics, strict=False):
        for method, points in curves[metric].items():
            if not points:
                continue
            st = style(methods.index(method))
            r, v = (np.asarray(a) for a in zip(*points, strict=True))
            ax.plot(r, v, color=st["color"], linestyle=st["linestyle"], marker=st["marker"],
                    markersize=3 if len(r) <= 60 else 0, label=method)
            best = best_rounds.get(method)
            if best is not None and best in set(r.tolist()):
                ax.plot([best], [v[r.tolist().index(best)]], marker="*", markersize=13, color=st["color"],
                        markeredgecolor="black", linestyle="none")
        ax.set_xlabel(xlabel)
        if log_x:
            ax.set_xscale("log")
        elif xlabel == "round":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # rounds are whole numbers, even in short runs
        if shares:
            ax.set_ylim(-0.03, 1.03)
        ax.set_ylabel(metric_label(metric))
        ax.set_title(metric_label(metric), fontsize=10)
        ax.grid(alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    for ax in axes[0][1:len(metrics)]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if best_rounds:
        handles.append(plt.Line2D([], [], marker="*", markersize=11, color="0.5", markeredgecolor="black",
                                  linestyle="none"))
        labels.append("best model (by validation)")
    fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 0.95), fontsize=8, frameon=False)
    fig.tight_layout()
    return finish(fig, path)


def plot_client_findings(grids: Mapping[str, tuple[Sequence[int], Sequence[int], np.ndarray]],
                         path: str | Path | None):
    """One heat map per method's finding about each client (``{title: (rounds, clients, values[client, round])}``,
    :func:`~hetfed.analysis.results.client_findings`): clients down, rounds across, the value as colour — a line
    a client stops reading past a dozen clients; a heat map reads the same for ten or a thousand."""
    n = len(grids)
    ncols = min(n, 2)
    nrows = math.ceil(n / ncols)
    fig, grid = plt.subplots(nrows, ncols, figsize=(6.0 * ncols, 3.8 * nrows), squeeze=False)
    for ax in grid.flat[n:]:
        ax.set_visible(False)
    for ax, (title, (rounds, clients, values)) in zip(grid.flat, grids.items(), strict=False):
        image = ax.imshow(np.ma.masked_invalid(values), aspect="auto", interpolation="nearest", cmap="viridis")
        for axis, labels in ((ax.xaxis, rounds), (ax.yaxis, clients)):  # a cell's index → its round or client
            axis.set_major_locator(MaxNLocator(nbins=8, integer=True))
            axis.set_major_formatter(lambda i, _, at=list(labels): str(at[int(i)]) if 0 <= int(i) < len(at) else "")
        ax.set_xlabel("round")
        ax.set_ylabel("client")
        ax.set_title(title, fontsize=10)
        fig.colorbar(image, ax=ax)
    fig.tight_layout()
    return finish(fig, path)


def plot_client_distribution(values: dict[str, list[float]], metric: str, path: str | Path | None):
    """Each method's per-client values (box + every client as a dot): the spread a mean hides."""
    return plot_client_distributions({"": values}, metric, path)


def plot_client_distributions(panels: dict[str, dict[str, list[float]]], metric: str, path: str | Path | None):
    """Per-client values of each method, one panel per setting (e.g. a sweep's grid points), shared y."""
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    width = max(len(v) for v in panels.values())
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(4.5, 0.9 * width + 2.2) * ncols, 3.6 * nrows),
                             squeeze=False, sharey=True)
    every = sorted({n for v in panels.values() for n in v})  # the learning curves' colours: sorted methods
    rng = np.random.default_rng(0)
    finite: list[float] = []
    for p, (title, values) in enumerate(panels.items()):
        ax = axes[p // ncols][p % ncols]
        names = list(values)
        data = [np.asarray([v for v in values[n] if v is not None and not math.isnan(v)]) for n in names]
        ax.boxplot(data, showfliers=False, widths=0.5, medianprops={"color": "black"})
        for i, d in enumerate(data):
            ax.scatter(i + 1 + rng.uniform(-0.15, 0.15, len(d)), d, s=10, alpha=0.7,
                       color=style(every.index(names[i]))["color"], zorder=3)
            finite += d.tolist()
        ax.set_xticks(range(1, len(names) + 1), names, rotation=20, ha="right")
        if p % ncols == 0:
            ax.set_ylabel(metric_label(metric))
        if title:
            ax.set_title(title, fontsize=8)
        ax.grid(alpha=0.3, axis="y")
    for q in range(len(panels), nrows * ncols):
        axes[q // ncols][q % ncols].set_visible(False)
    lo, hi = metric_range(metric)
    if lo is not None and hi is not None and finite:
        pad = 0.03 * (hi - lo)
        axes[0][0].set_ylim(max(lo, min(finite) - pad), min(hi, max(finite)) + pad)
    fig.suptitle(f"{metric_label(metric)} per client, best model (box: quartiles; dots: clients)", fontsize=10)
    fig.tight_layout()
    return finish(fig, path)


# ------------------------------------------------------------------ sweeps


def grid_order(value: object) -> tuple[int, float | str]:
    """Sort key for grid values of mixed kinds: numbers by value, then the rest by spelling."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return (0, float(value))
    return (1, str(value))


def _numeric(values: list[Any]) -> bool:
    return bool(values) and all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)


def _log_scale(values: list[Any]) -> bool:
    """Log x when positive numbers span two orders of magnitude (α = 0.05 … 100)."""
    return _numeric(values) and min(values) > 0 and max(values) / min(values) >= 100


def _ci_note(rows: list[dict]) -> str:
    from hetfed.runs.sweep_tables import MIN_SEEDS_FOR_CI

    ns = sorted({int(r["n"]) for r in rows})
    n = str(ns[0]) if len(ns) == 1 else f"{ns[0]}–{ns[-1]}"
    return f"mean ± 95% CI (Student t over n = {n} seeds; no CI below {MIN_SEEDS_FOR_CI})"


def plot_sweep(table: list[dict], grid: dict[str, list[Any]] | str, metric: str, path: str | Path | None,
               methods: list[str] | None = None):
    """A metric against a swept key, one series per method, with 95% CIs clipped to the metric's range.

    The x key is the first numeric key of the grid (else the first key); every
    combination of the other keys is its own panel. Numeric keys are joined by
    lines (a log axis when they span two orders of magnitude); categorical ones
    (iid, shards, …) are points with error bars, in the grid's order, methods
    side by side so none hides another.
    """
    if isinstance(grid, str):  # one key, values from the table
        grid = {grid: sorted({r[grid] for r in table}, key=grid_order)}
    keys = list(grid)
    from hetfed.runs.sweep_tables import cell

    order = {k: [cell(v) for v in grid[k]] for k in keys}
    xkey = next((k for k in keys if _numeric(order[k]) and len(order[k]) > 1), keys[0])
    others = [k for k in keys if k != xkey]
    panels = [dict(zip(others, combo, strict=True)) for combo in _product([order[k] for k in others])]
    rows = [r for r in table if r["metric"] == metric]
    methods = methods or sorted({r["method"] for r in rows})
    ncols = min(3, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    xs_all = order[xkey]
    numeric = _numeric(xs_all)
    width = 4.8 if numeric else max(4.8, 1.25 * len(xs_all))  # room for each category's (wrapped) tick
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols + 1.8, 3.8 * nrows), squeeze=False, sharey=True)
    for p, panel in enumerate(panels):
        ax = axes[p // ncols][p % ncols]
        for i, method in enumerate(methods):
            sel = [r for r in rows if r["method"] == method and all(r[k] == v for k, v in panel.items())]
            by_x = {r[xkey]: r for r in sel}
            xs = [x for x in xs_all if x in by_x]
            if not xs:
                continue
            mean = np.array([by_x[x]["mean"] for x in xs], dtype=float)
            ci = np.array([by_x[x]["ci95"] for x in xs], dtype=float)
            lo, hi = _clip(mean - ci, metric), _clip(mean + ci, metric)
            st = style(i)
            if numeric:
                ax.plot(xs, mean, color=st["color"], marker=st["marker"], linestyle=st["linestyle"], label=method,
                        markersize=5, alpha=0.9)
                ax.fill_between(xs, lo, hi, color=st["color"], alpha=0.12, linewidth=0)
            else:
                pos = np.array([xs_all.index(x) for x in xs]) + (i - (len(methods) - 1) / 2) * 0.7 / max(
                    len(methods), 1
                )
                ax.errorbar(pos, mean, yerr=[mean - lo, hi - mean], color=st["color"], marker=st["marker"],
                            linestyle="none", capsize=3, label=method)
        if numeric and _log_scale(xs_all):
            ax.set_xscale("log")
        shared = ""
        if not numeric:
            ticks, shared = tick_labels(xs_all)
            ax.set_xticks(range(len(xs_all)), ticks, fontsize=8)
            ax.set_xlim(-0.6, len(xs_all) - 0.4)
        ax.set_xlabel(key_label(xkey) + (f" (every one: {shared})" if shared else ""))
        if p % ncols == 0:
            ax.set_ylabel(metric_label(metric))
        if panel:
            ax.set_title(", ".join(f"{k} = {v}" for k, v in panel.items()), fontsize=9)
        ax.grid(alpha=0.3)
    for q in range(len(panels), nrows * ncols):
        axes[q // ncols][q % ncols].set_visible(False)
    low, high = metric_range(metric)
    if low is not None and high is not None:
        top = max((r["mean"] + np.nan_to_num(r["ci95"]) for r in rows), default=high)
        bottom = min((r["mean"] - np.nan_to_num(r["ci95"]) for r in rows), default=low)
        pad = 0.03 * (high - low)
        axes[0][0].set_ylim(max(low, bottom) - pad, min(high, top) + pad)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 0.92), fontsize=8, frameon=False)
    fig.suptitle(f"{metric_label(metric)}\n{_ci_note(rows) if rows else ''}", fontsize=10)
    fig.tight_layout()
    return finish(fig, path)


def _product(lists: list[list[Any]]) -> list[tuple]:
    import itertools

    return list(itertools.product(*lists)) if lists else [()]


#: more lines than this in one panel and the CI bands would hide each other: lines only
MAX_BANDS = 4


def plot_mean_curves(curves: dict[str, dict[str, list[list[tuple[int, float]]]]], metric: str,
                     path: str | Path | None):
    """Mean learning curves over seeds: one panel per method, one line (± 95% CI band) per grid point.

    ``curves[method][grid point] = [run's [(round, value)], …]``.
    """
    from hetfed.runs.sweep_tables import MIN_SEEDS_FOR_CI, ci95

    methods = sorted(curves)
    ncols = min(3, len(methods))
    nrows = math.ceil(len(methods) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.8 * ncols + 2.2, 3.6 * nrows), squeeze=False, sharey=True)
    ns: set[int] = set()
    for m, method in enumerate(methods):
        ax = axes[m // ncols][m % ncols]
        for i, (label, runs) in enumerate(curves[method].items()):
            values: dict[int, list[float]] = {}
            for run in runs:
                for r, v in run:
                    values.setdefault(r, []).append(v)
            rounds = sorted(values)
            by_round = [values[r] for r in rounds]
            ns.update(len(v) for v in by_round)
            mean = np.array([np.mean(v) for v in by_round])
            band = np.array([ci95(v) for v in by_round])
            st = style(i)
            ax.plot(rounds, mean, color=st["color"], linestyle=st["linestyle"], label=label)
            if len(curves[method]) <= MAX_BANDS:
                ax.fill_between(rounds, _clip(mean - band, metric), _clip(mean + band, metric), color=st["color"],
                                alpha=0.12, linewidth=0)
        ax.set_title(method, fontsize=10)
        ax.set_xlabel("round")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if m % ncols == 0:
            ax.set_ylabel(metric_label(metric))
        ax.grid(alpha=0.3)
    for q in range(len(methods), nrows * ncols):
        axes[q // ncols][q % ncols].set_visible(False)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper left", bbox_to_anchor=(1.0, 0.92), fontsize=8, frameon=False,
               title="grid point")
    n = "–".join(str(x) for x in sorted({min(ns), max(ns)})) if ns else "0"
    crowded = max(len(c) for c in curves.values()) > MAX_BANDS
    bands = (f" (95% CI bands drawn for ≤ {MAX_BANDS} lines per panel" if crowded else " ± 95% CI (Student t"
             ) + f"; no band below {MIN_SEEDS_FOR_CI} seeds)"
    fig.suptitle(f"{metric_label(metric)} per round: mean over n = {n} seeds{bands}", fontsize=10)
    fig.tight_layout()
    return finish(fig, path)


def plot_global_vs_local(table: list[dict], key: str, path: str | Path | None):
    """FedMoE Fig. 3: best global vs local accuracy, one point per grid value, per method."""
    fig, ax = plt.subplots(figsize=(7, 5))
    methods = sorted({r["method"] for r in table if r["method"] != "(data)"})
    for i, method in enumerate(methods):
        local = {
            r[key]: r["mean"] for r in table if r["method"] == method and r["metric"] == "best.local_accuracy_mean"
        }
        glob = {r[key]: r["mean"] for r in table if r["method"] == method and r["metric"] == "best.global_accuracy"}
        keys = sorted(set(local) & set(glob), key=grid_order)
        st = style(i)
        ax.plot([local[k] for k in keys], [glob[k] for k in keys], color=st["color"], marker=st["marker"],
                linestyle=st["linestyle"], label=method)
        for k in keys:
            ax.annotate(str(k), (local[k], glob[k]), fontsize=7, alpha=0.7)
    ax.set_xlabel(metric_label("best.local_accuracy_mean"))
    ax.set_ylabel(metric_label("best.global_accuracy"))
    ax.set_title(f"global vs local accuracy; labels: {key}")
    ax.grid(alpha=0.3)
    _legend(ax, len(methods))
    return finish(fig, path)


def plot_relative(table: list[dict], key: str, metric: str, baseline: str, path: str | Path | None):
    """FedMoE Fig. 5: a metric as a fraction of a baseline method's, vs a swept key."""
    fig, ax = plt.subplots(figsize=(7, 4))
    base = {r[key]: r["mean"] for r in table if r["method"] == baseline and r["metric"] == metric}
    methods = sorted({r["method"] for r in table if r["method"] not in ("(data)",)})
    for i, method in enumerate(methods):
        vals = {r[key]: r["mean"] for r in table if r["method"] == method and r["metric"] == metric}
        keys = sorted((k for k in vals if base.get(k)), key=grid_order)
        st = style(i)
        ax.plot(keys, [vals[k] / base[k] for k in keys], color=st["color"], marker=st["marker"],
                linestyle=st["linestyle"], label=method)
    if _log_scale(list(base)):
        ax.set_xscale("log")
    ax.set_xlabel(key_label(key))
    ax.set_ylabel(f"÷ {baseline}'s")
    ax.set_title(f"{metric_label(metric)}, relative to {baseline}")
    ax.grid(alpha=0.3)
    _legend(ax, len(methods))
    return finish(fig, path)


def plot_accuracy_vs_heterogeneity(points: dict[str, list[tuple[float, float, float, str]]], metric: str,
                                   path: str | Path | None):
    """Every method's ``metric`` (mean ± CI over seeds) against the partition's excess heterogeneity ΔΓ.

    ``points``: method → ``[(ΔΓ, mean, ci95, partition label), …]``, one per partition; a line per
    method, sorted by ΔΓ, so a reader sees which methods hold up as the clients grow apart.
    """
    fig, ax = plt.subplots(figsize=(8.5, 4.8))
    labels: dict[float, str] = {}
    lowest = np.inf
    for i, (method, pts) in enumerate(points.items()):
        pts = sorted(p for p in pts if np.isfinite(p[0]) and np.isfinite(p[1]))
        if not pts:
            continue
        x, y, ci = (np.array([p[j] for p in pts], dtype=float) for j in range(3))
        ax.errorbar(x, _clip(y, metric), yerr=np.nan_to_num(ci), capsize=3, label=method, markersize=5, **style(i))
        labels.update({p[0]: p[3] for p in pts})
        lowest = min(lowest, float(np.nanmin(y - np.nan_to_num(ci))))
    for j, (at, label) in enumerate(sorted(labels.items())):  # staggered, so close partitions stay legible
        ax.annotate(label, (at, 0), xycoords=("data", "axes fraction"), xytext=(0, 3 + 9 * (j % 2)),
                    textcoords="offset points", ha="center", fontsize=7, color="0.35")
    ax.set_xlabel("ΔΓ = Γ − Γ_IID (excess heterogeneity of the partition)")
    ax.set_ylabel(metric_label(metric))
    lo, hi = metric_range(metric)
    if lo is not None and np.isfinite(lowest):  # the data's range, not the metric's: differences stay visible
        lo = max(lo, np.floor((lowest - 0.05) * 10) / 10)
    ax.set_ylim(lo, hi)
    ax.grid(alpha=0.3)
    _legend(ax, len(points))
    return finish(fig, path)


def plot_membership_roc(scores: Mapping[str, tuple[np.ndarray, np.ndarray]], path: str | Path | None):
    """ROC curves of membership attacks on log-log axes (Carlini et al. 2022: what matters is the true-positive rate
    at a low false-positive rate); ``scores``: per curve, (members' scores, non-members' scores)."""
    from sklearn.metrics import roc_curve

    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for name, (members, others) in scores.items():
        fpr, tpr, _ = roc_curve(np.r_[np.ones(len(members)), np.zeros(len(others))], np.r_[members, others])
        ax.plot(np.maximum(fpr, 1e-4), np.maximum(tpr, 1e-4), label=name)
    ax.plot([1e-4, 1], [1e-4, 1], color="0.6", linestyle=":", label="chance")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("false-positive rate")
    ax.set_ylabel("true-positive rate")
    ax.set_title("membership inference")
    _legend(ax, len(scores) + 1)
    return finish(fig, path)


def plot_reconstructions(pairs: Mapping[str, tuple[np.ndarray, np.ndarray]], path: str | Path | None, most: int = 8):
    """Per method, a gradient inversion's first ``most`` reconstructions (lower row) under the client's samples
    nearest them (upper row); images ``[n, H, W]``."""
    rows = [(name, truth[:most], guess[:most]) for name, (truth, guess) in pairs.items()]
    cols = max(len(t) for _, t, _ in rows)
    fig, axes = plt.subplots(2 * len(rows), cols, figsize=(1.1 * cols, 2.4 * len(rows)), squeeze=False)
    for r, (name, truth, guess) in enumerate(rows):
        for c in range(cols):
            for i, images in enumerate((truth, guess)):
                ax = axes[2 * r + i, c]
                ax.set_xticks([])
                ax.set_yticks([])
                if c < len(images):
                    ax.imshow(images[c], cmap="gray", vmin=float(truth.min()), vmax=float(truth.max()))
                else:
                    ax.axis("off")
        axes[2 * r, 0].set_ylabel(f"{name}\nclient", fontsize=8)
        axes[2 * r + 1, 0].set_ylabel("server", fontsize=8)
    fig.suptitle("gradient inversion: the client's samples and what the server reconstructed")
    return finish(fig, path)
