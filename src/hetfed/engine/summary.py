"""What the server makes of an evaluation: the clients' reports (:mod:`hetfed.engine.evaluate`) and its own model's
scores turned into the run's metrics (:func:`summarise`):

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

:func:`summaries` summarises many runs' evaluations at once (a stacked sweep's): the same numbers, to the bit.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from numpy.typing import ArrayLike

from hetfed.engine.evaluate import Evaluation, auc

#: a client report ``mean.<name>`` (an algorithm's own diagnostic) becomes the metric ``<name>``: its mean over clients
MEAN_PREFIX = "mean."

#: per-client numbers that are metrics of their own (written to metrics.csv per client)
PER_CLIENT = ("local_accuracy", "local_loss", "val_loss", "val_accuracy", "local_auc", "global_accuracy", "global_loss")


def ci95_over(values: Iterable[float | None]) -> float:
    """Half-width of the 95% CI of the mean (Student t) of the finite values (None and NaN skipped);
    NaN with fewer than 2."""
    v = np.asarray([np.nan if x is None else x for x in values], dtype=float)
    v = v[~np.isnan(v)]
    if len(v) < 2:
        return float("nan")
    return float(_t975(len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v)))


@functools.lru_cache(maxsize=1024)
def _t975(df: int) -> float:
    """Student t's 97.5 % quantile for ``df`` degrees of freedom (kept: scipy takes ~30 µs a call, and every
    evaluation of every run asks for the same few)."""
    from scipy import stats

    return float(stats.t.ppf(0.975, df))


def _stat(values: ArrayLike, fn: Callable[..., Any], *args: Any) -> float:
    """A nan-aware statistic that is NaN (not a warning) when nothing was measured."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return float(fn(v, *args)) if len(v) else float("nan")


def _percentiles(values: np.ndarray, qs: tuple[float, ...]) -> list[float]:
    """The finite values' percentiles ``qs`` in one call (NaN each when nothing was measured)."""
    v = values[~np.isnan(values)]
    return [float(p) for p in np.percentile(v, qs)] if len(v) else [float("nan")] * len(qs)


def weighted_mean(values: ArrayLike, weights: ArrayLike | None) -> float:
    """The mean of the finite ``values`` weighted by ``weights`` (unweighted when there are none)."""
    v = np.asarray(values, dtype=float)
    w = np.ones_like(v) if weights is None else np.asarray(weights, dtype=float)
    ok = ~np.isnan(v) & (w > 0)
    return float(np.average(v[ok], weights=w[ok])) if ok.any() else float("nan")


def worst_fraction_mean(values: ArrayLike, fraction: float) -> float:
    """The mean of the lowest ``fraction`` of the finite values (⌈fraction · n⌉ of them, at least one)."""
    v = np.sort(np.asarray(values, dtype=float)[~np.isnan(np.asarray(values, dtype=float))])
    if not len(v):
        return float("nan")
    return float(v[: max(1, int(np.ceil(fraction * len(v))))].mean())


def summarise(reports: dict[str, list[Any]], ids: list[int], opted_out: np.ndarray, n_classes: int,
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
    p10, p50, p90 = _percentiles(local, (10, 50, 90))
    metrics: dict[str, float] = {
        "local_accuracy_mean": _stat(local, np.mean),
        "local_accuracy_weighted": weighted_mean(local, reports.get("local_n")),
        "local_accuracy_worst10": worst_fraction_mean(local, 0.1),
        "local_accuracy_std": _stat(local, np.std),
        "local_accuracy_p10": p10,
        "local_accuracy_p50": p50,
        "local_accuracy_p90": p90,
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
            probs = scored[0]
            for p in scored[1:]:
                probs = probs + p
            metrics["global_auc"] = auc(y_global.cpu().numpy(), (probs / len(scored))[:, 1].cpu().numpy())
    for key in reports:  # an algorithm's own per-client diagnostics (FedMoE's gate): their mean over clients
        if key.startswith(MEAN_PREFIX):
            metrics[key[len(MEAN_PREFIX):]] = _stat(reports[key], np.mean)
    per_client = {k: list(reports[k]) for k in PER_CLIENT if k in reports}
    return Evaluation(metrics, per_client)


#: the reports a summary of many evaluations at once reads (any other — an AUC, a personal model's global scores, an
#: algorithm's own diagnostic — is summarised one evaluation at a time)
_AT_ONCE = frozenset({"local_accuracy", "local_loss", "local_n", "val_loss", "val_accuracy", "val_loss_sum", "val_n"})
_NEEDED = frozenset({"local_accuracy", "local_loss", "val_accuracy", "val_loss_sum", "val_n"})


@dataclass(frozen=True, eq=False)
class Reports:
    """One evaluation to summarise: :func:`summarise`'s arguments."""

    reports: dict[str, list[Any]]
    ids: list[int]
    opted_out: np.ndarray
    n_classes: int
    server: dict[str, float] | None = None
    y_global: torch.Tensor | None = None

    def summary(self) -> Evaluation:
        return summarise(self.reports, self.ids, self.opted_out, self.n_classes, self.server, self.y_global)

    def shape(self) -> tuple[Any, ...] | None:
        """Evaluations of one shape are summarised together (:func:`summaries`): as many clients, the same reports.
        None: this one alone — a binary task, an opted-out client among those evaluated, a report besides the
        plain ones."""
        keys = set(self.reports)
        if (self.n_classes == 2 or not _NEEDED <= keys <= _AT_ONCE or not self.ids
                or np.asarray(self.opted_out, dtype=bool)[self.ids].any()):
            return None
        return len(self.ids), tuple(sorted(keys))


def summaries(evaluations: Sequence[Reports]) -> list[Evaluation]:
    """:func:`summarise` of each evaluation, those of one :meth:`~Reports.shape` as arrays ``[evaluations,
    clients]``: each statistic one numpy call for all of them (a stacked sweep's runs: ~0.1 ms a run's summary one by
    one). A statistic of a row is computed as of the row alone — numpy reduces each row along its own contiguous
    axis, in the same order — so every number equals :func:`summarise`'s, to the bit (tested); a row with a NaN
    (a statistic of it drops the NaN) or a client of no weight is summarised alone."""
    out: list[Evaluation | None] = [None] * len(evaluations)
    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, e in enumerate(evaluations):
        shape = e.shape()
        if shape is None:
            out[i] = e.summary()
        else:
            groups.setdefault(shape, []).append(i)
    for members in groups.values():
        group = [evaluations[i] for i in members]
        for i, ev in zip(members, _at_once(group), strict=True):
            out[i] = ev if ev is not None else evaluations[i].summary()
    return cast(list[Evaluation], out)


def _rows(group: Sequence[Reports], key: str) -> np.ndarray:
    return np.array([e.reports[key] for e in group], dtype=float)


def _at_once(group: Sequence[Reports]) -> list[Evaluation | None]:
    """The summaries of evaluations of one shape (None for a row to summarise alone)."""
    local, loss = _rows(group, "local_accuracy"), _rows(group, "local_loss")
    weighted = "local_n" in group[0].reports
    weights = _rows(group, "local_n") if weighted else np.ones_like(local)
    whole = ~(np.isnan(local).any(1) | np.isnan(loss).any(1) | (weights <= 0).any(1))
    if not whole.any():
        return [None] * len(group)
    rows = np.flatnonzero(whole)
    local, loss, weights = local[rows], loss[rows], weights[rows]
    val_n = _rows(group, "val_n")[rows]
    used = val_n != 0
    # the pooled validation sums, client after client as summarise adds them (cumsum is sequential)
    val_loss_sum = np.where(used, _rows(group, "val_loss_sum")[rows], 0.0).cumsum(1)[:, -1]
    val_correct = np.where(used, _rows(group, "val_accuracy")[rows] * val_n, 0.0).cumsum(1)[:, -1]
    pooled = val_n.cumsum(1)[:, -1]
    k = local.shape[1]
    p10, p50, p90 = np.percentile(local, (10, 50, 90), axis=1)
    columns = {
        "local_accuracy_mean": np.mean(local, axis=1),
        "local_accuracy_weighted": np.average(local, weights=weights, axis=1),
        "local_accuracy_worst10": np.sort(local, axis=1)[:, :max(1, int(np.ceil(0.1 * k)))].mean(axis=1),
        "local_accuracy_std": np.std(local, axis=1),
        "local_accuracy_p10": p10,
        "local_accuracy_p50": p50,
        "local_accuracy_p90": p90,
        "local_loss_mean": np.mean(loss, axis=1),
        "local_accuracy_ci95": (_t975(k - 1) * local.std(axis=1, ddof=1) / np.sqrt(k) if k >= 2
                                else np.full(len(rows), np.nan)),
    }
    out: list[Evaluation | None] = [None] * len(group)
    for j, r in enumerate(rows.tolist()):
        e = group[r]
        n = float(pooled[j])
        metrics = {name: float(column[j]) for name, column in columns.items()}
        metrics.update(n_eval_clients=float(k), val_loss=float(val_loss_sum[j]) / n if n else float("nan"),
                       val_accuracy=float(val_correct[j]) / n if n else float("nan"))
        metrics.update(e.server or {})
        out[r] = Evaluation(metrics, {key: list(e.reports[key]) for key in PER_CLIENT if key in e.reports})
    return out
