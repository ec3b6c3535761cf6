"""How results are named and coloured for people: words for metric keys, a colour-blind-safe palette.

Pure data and functions (no matplotlib), shared by the figures, the report and the
tables, so a metric is called the same everywhere.
"""

from __future__ import annotations

import json
import re
import textwrap
from collections.abc import Sequence
from typing import Any, cast

#: Okabe & Ito (2008): distinguishable with the common colour-vision deficiencies
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")
#: markers and dash patterns cycle with the colours, so overlapping lines stay visible
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
DASHES = ("-", "--", "-.", ":")

_BASE = {
    "global_accuracy": "global test accuracy",
    "global_loss": "global test loss",
    "global_auc": "global test AUC",
    "local_accuracy": "local test accuracy",
    "local_accuracy_mean": "local test accuracy (mean over clients)",
    "local_accuracy_p10": "local test accuracy (10th percentile of clients)",
    "local_accuracy_weighted": "local test accuracy (clients weighted by test size)",
    "local_accuracy_worst10": "local test accuracy (mean of the worst 10% of clients)",
    "local_accuracy_std": "local test accuracy (standard deviation across clients)",
    "local_accuracy_opted_in_mean": "local test accuracy (mean over opted-in clients)",
    "local_accuracy_opted_out_mean": "local test accuracy (mean over opted-out clients)",
    "local_auc_mean": "local test AUC (mean over clients)",
    "local_loss_mean": "local test loss (mean over clients)",
    "server_accuracy": "unseen-client accuracy (server model)",
    "server_loss": "unseen-client loss (server model)",
    "val_loss": "validation loss (clients' data)",
    "val_accuracy": "validation accuracy",
    "train_loss": "training loss (mean over the round's clients)",
    "seconds_per_round": "seconds per training round",
    "server_seconds_per_round": "server seconds per round",
    "gamma": "Γ (mean Fréchet distance)",
    "gamma_iid": "Γ of a size-matched IID split",
    "gamma_excess": "ΔΓ = Γ − Γ_IID",
    "gamma_iid_sd": "sd of Γ_IID over its random draws",
    "gamma_given_label": "Γ(x|y) (Γ per class, across its clients)",
    "gamma_given_label_excess": "ΔΓ(x|y) = Γ(x|y) − Γ(x|y)_IID",
    "gamma_measured_on": "Γ measured on",
    "gamma_estimator": "Γ estimator",
    "label_emd_mean": "label skew (mean EMD to the pooled labels)",
    "js_mean": "label skew (mean Jensen–Shannon divergence)",
}
_WHEN = {"best": "best model", "final": "final round"}
_LEAKED = {
    "global_auc": "membership AUC against the server's model",
    "global_tpr_at_1pct_fpr": "membership TPR at 1% FPR, server's model",
    "personal_auc": "membership AUC against the clients' own models",
    "personal_tpr_at_1pct_fpr": "membership TPR at 1% FPR, clients' own models",
    "psnr": "inversion PSNR (dB)",
    "ssim": "inversion SSIM",
    "labels_recovered": "labels recovered by inversion",
}
_DEFENDED = {
    "attackers_excluded": "malicious updates the defence left out (share)",
    "honest_excluded": "honest updates the defence left out (share)",
    "attack_weight": "the malicious updates' share of the defence's weight",
}

_KEYS = {
    "partition.shuffle": "fraction of samples reassigned at random",
    "partition.alpha": "Dirichlet concentration α",
    "partition.p": "majority-class fraction p",
    "partition.kind": "partition",
    "partition.opt_out": "opted-out fraction q",
    "partition.n_clients": "number of clients",
    "train.client_fraction": "fraction of clients per round",
    "train.rounds": "rounds",
    "train.local_epochs": "local epochs",
    "train.optimizer.lr": "learning rate",
    "dataset.name": "dataset",
}


def metric_label(key: str) -> str:
    """``best.local_accuracy_mean`` → "local test accuracy (mean over clients), best model"."""
    when, _, base = key.rpartition(".")
    if when == "leakage":  # what the server learnt: an attack's score, not the model's
        return _LEAKED.get(base) or f"leakage: {base.replace('_', ' ')}"
    if when == "defence":  # what the server's defence decided under an attack
        return _DEFENDED.get(base) or f"defence: {base.replace('_', ' ')}"
    words = _BASE.get(base) or base.replace("_", " ")
    return f"{words}, {_WHEN[when]}" if when in _WHEN else words


def key_label(key: str) -> str:
    """A swept config key in words, with the key itself so it can be typed again."""
    words = _KEYS.get(key)
    return f"{words} ({key})" if words else key


def metric_range(key: str) -> tuple[float | None, float | None]:
    """The values a metric can take: bands and axes are clipped to it (accuracies and AUCs in [0, 1])."""
    base = key.rpartition(".")[2]
    if re.search(r"(accuracy|auc)", base):
        return 0.0, 1.0
    if re.search(r"(loss|seconds|emd)", base) or base in ("gamma", "gamma_iid"):
        return 0.0, None
    return None, None


def style(i: int) -> dict:
    """The i-th series' colour, marker and dash pattern: past the palette's eight colours the markers move on by
    one, so no two of the first 64 series look alike even as points without lines."""
    return {"color": PALETTE[i % len(PALETTE)], "marker": MARKERS[(i + i // len(PALETTE)) % len(MARKERS)],
            "linestyle": DASHES[(i // len(PALETTE)) % len(DASHES)]}


def tick_labels(values: Sequence[Any], width: int = 20) -> tuple[list[str], str]:
    """Readable ticks for a categorical axis, and what they all share (for the axis label). A swept section
    (``partition={kind: iid, rotations: …}``, a compact-JSON cell) shows on each tick only the keys in which its
    values differ, wrapped to ``width`` (— where it has none of its own); the pairs every value has are returned
    beside. Other values: themselves, wrapped, and ""."""
    parsed = [_section(v) for v in values]
    if not parsed or any(d is None for d in parsed):
        return [textwrap.fill(str(v), width) for v in values], ""
    sections = cast(list[dict[str, Any]], parsed)
    shared = {k: v for k, v in sections[0].items() if all(k in d and d[k] == v for d in sections[1:])}
    ticks = ["\n".join(textwrap.fill(_pair(k, v), width) for k, v in d.items() if k not in shared) or "—"
             for d in sections]
    return ticks, ", ".join(_pair(k, v) for k, v in shared.items())


def _section(value: Any) -> dict[str, Any] | None:
    try:
        parsed = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _pair(key: str, value: Any) -> str:
    return f"{key}: {value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)}"
