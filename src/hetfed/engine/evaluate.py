"""Evaluation of a round: the server summarises what the clients report.

Each client scores its own model on its own validation/test sets (the client
step :meth:`hetfed.interface.Algorithm.evaluate_client`, run by the executor);
only those numbers come back. The server turns them into the run's metrics and
scores its own model on the balanced global test set:

- ``global_accuracy``/``global_loss``: the balanced global test set. For a method
  without personal parameters this is the server's model; for a personalised one
  it is the mean over clients of their own model on the global test set (how the
  FedMoE paper reports it), and ``server_accuracy`` is the server's model alone
  (local parameters at their value for an unseen client) when there is one.
- ``local_accuracy_*``: each client's model on its own test set — mean, std and
  the 10/50/90th percentiles over clients, like LEAF; ``local_accuracy_weighted``
  weights the clients by their test sizes (the accuracy over all the clients' test
  samples pooled, what PFLlib reports) and ``local_accuracy_worst10`` is the mean of
  the worst 10% of clients (at least one: the clients a method leaves behind).
- ``val_loss``/``val_accuracy``: the opted-in clients' validation sets, pooled
  (weighted by size) — what best-model selection and early stopping use, so an
  opted-out client's data never influences which global model is kept.
- ``global_auc``/``local_auc_mean`` for binary tasks (imbalanced data).
- ``global_accuracy_own``/``_other`` (personalised): the global test set split, per
  client, into its own classes (share of its training labels above 1/C) and the
  others — what a personal model kept of the classes its client rarely sees.
- ``<name>`` for every per-client report ``mean.<name>``: an algorithm's own
  diagnostic (FedMoE's gate weights), averaged over the evaluated clients.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from hetfed.engine.rng import GLOBAL_TEST, numpy_rng
from hetfed.interface import _auc

#: a client report ``mean.<name>`` (an algorithm's own diagnostic) becomes the metric ``<name>``: its mean over clients
MEAN_PREFIX = "mean."

#: per-client numbers that are metrics of their own (written to metrics.csv per client)
PER_CLIENT = ("local_accuracy", "local_loss", "val_loss", "val_accuracy", "local_auc", "global_accuracy", "global_loss")


@dataclass(frozen=True, eq=False)
class Evaluation:
    metrics: dict[str, float]
    per_client: dict[str, list[float]]  # metric → value per client (in the order of the evaluated ids)


def global_test(fed, train, seed: int, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The global test set an evaluation scores, on ``device``: all of it, or a fixed class-balanced
    subset of ``train.global_test_size`` samples (the same at every evaluation)."""
    x, y = np.asarray(fed.x_global_test, dtype=np.float32), np.asarray(fed.y_global_test, dtype=np.int64)
    n = train.global_test_size
    if n is not None and n < len(y):
        classes = np.unique(y)
        per = max(1, n // len(classes))
        rng = numpy_rng(seed, GLOBAL_TEST, 0)
        idx = np.sort(np.concatenate([rng.permutation(np.flatnonzero(y == c))[:per] for c in classes]))
        x, y = x[idx], y[idx]
    return torch.as_tensor(x, device=device), torch.as_tensor(y, device=device)


def ci95_over(values) -> float:
    """Half-width of the 95% CI of the mean (Student t) of the finite values (None and NaN skipped);
    NaN with fewer than 2."""
    from scipy import stats

    v = np.asarray([np.nan if x is None else x for x in values], dtype=float)
    v = v[~np.isnan(v)]
    if len(v) < 2:
        return float("nan")
    return float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))


def _stat(values, fn, *args) -> float:
    """A nan-aware statistic that is NaN (not a warning) when nothing was measured."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return float(fn(v, *args)) if len(v) else float("nan")


def weighted_mean(values, weights) -> float:
    """The mean of the finite ``values`` weighted by ``weights`` (unweighted when there are none)."""
    v = np.asarray(values, dtype=float)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=float)
    ok = ~np.isnan(v) & (w > 0)
    return float(np.average(v[ok], weights=w[ok])) if ok.any() else float("nan")


def worst_fraction_mean(values, fraction: float) -> float:
    """The mean of the lowest ``fraction`` of the finite values (⌈fraction · n⌉ of them, at least one)."""
    v = np.sort(np.asarray(values, dtype=float)[~np.isnan(np.asarray(values, dtype=float))])
    if not len(v):
        return float("nan")
    return float(v[: max(1, int(np.ceil(fraction * len(v))))].mean())


def summarise(reports: dict[str, list], ids: list[int], opted_out: np.ndarray, n_classes: int,
              server: dict[str, float] | None = None, y_global: torch.Tensor | None = None) -> Evaluation:
    """The run's metrics from the clients' reports (lists in the order of ``ids``) and the
    server's own scores (``server``: its model on the global test set)."""
    opted = np.asarray(opted_out, dtype=bool)
    val_loss_sum = val_correct = val_n = 0.0
    for j, k in enumerate(ids):
        n = reports["val_n"][j]
        if n and not opted[k]:  # opted-out data must not pick the global model
            val_loss_sum += reports["val_loss_sum"][j]
            val_correct += reports["val_accuracy"][j] * n
            val_n += n
    local = np.asarray(reports["local_accuracy"], dtype=float)
    metrics: dict[str, float] = {
        "local_accuracy_mean": _stat(local, np.mean),
        "local_accuracy_weighted": weighted_mean(local, reports.get("local_n")),
        "local_accuracy_worst10": worst_fraction_mean(local, 0.1),
        "local_accuracy_std": _stat(local, np.std),
        "local_accuracy_p10": _stat(local, np.percentile, 10),
        "local_accuracy_p50": _stat(local, np.percentile, 50),
        "local_accuracy_p90": _stat(local, np.percentile, 90),
        "local_loss_mean": _stat(reports["local_loss"], np.mean),
        "local_accuracy_ci95": ci95_over(local),
        "n_eval_clients": float(len(ids)),
        "val_loss": val_loss_sum / val_n if val_n else float("nan"),
        "val_accuracy": val_correct / val_n if val_n else float("nan"),
    }
    binary = n_classes == 2
    if binary:
        metrics["local_auc_mean"] = _stat(reports["local_auc"], np.mean)
    if opted.any():  # do the clients who keep their data out still benefit?
        out = opted[ids]
        metrics["local_accuracy_opted_in_mean"] = _stat(local[~out], np.mean)
        metrics["local_accuracy_opted_out_mean"] = _stat(local[out], np.mean)
    metrics.update(server or {})
    if "global_accuracy" in reports:  # personalised: each client's own model on the global test set
        metrics["global_accuracy"] = _stat(reports["global_accuracy"], np.mean)  # NaN: did not score it
        metrics["global_loss"] = _stat(reports["global_loss"], np.mean)
        for key in ("global_accuracy_own", "global_accuracy_other"):
            if key in reports:
                metrics[key] = _stat(reports[key], np.mean)
        scored = [p for p in reports.get("global_probs", []) if p is not None]
        if binary and y_global is not None and scored:
            probs = None
            for p in scored:
                probs = p if probs is None else probs + p
            metrics["global_auc"] = _auc(y_global.cpu().numpy(), (probs / len(scored))[:, 1].cpu().numpy())
    for key in reports:  # an algorithm's own per-client diagnostics (FedMoE's gate): their mean over clients
        if key.startswith(MEAN_PREFIX):
            metrics[key[len(MEAN_PREFIX):]] = _stat(reports[key], np.mean)
    per_client = {k: list(reports[k]) for k in PER_CLIENT if k in reports}
    return Evaluation(metrics, per_client)
