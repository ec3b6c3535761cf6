"""Evaluation of a round: global test set, every client's local test and validation sets.

- ``global_accuracy``/``global_loss``: the balanced global test set. For a method
  without personal parameters this is the server's model; for a personalised one
  it is the mean over clients of their own model on the global test set (how the
  FedMoE paper reports it), and ``server_accuracy`` is the server's model alone
  (local parameters at their value for an unseen client) when there is one.
- ``local_accuracy_*``: each client's model on its own test set — mean, std and
  the 10/50/90th percentiles over clients, like LEAF.
- ``val_loss``/``val_accuracy``: the opted-in clients' validation sets, pooled
  (weighted by size) — what best-model selection and early stopping use, so an
  opted-out client's data never influences which global model is kept.
- ``global_auc``/``local_auc_mean`` for binary tasks (imbalanced data).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from hetfed.algorithms.base import Algorithm
from hetfed.engine.types import ClientState, ServerState, split_state, stack_states


@dataclass(frozen=True, eq=False)
class Evaluation:
    metrics: dict[str, float]
    per_client: dict[str, list[float]]  # metric → value per client (by client id)


def _auc(y: np.ndarray, score: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    if len(np.unique(y)) < 2:
        return float("nan")
    return float(roc_auc_score(y, score))


@torch.no_grad()
def predict(model, params: dict[str, torch.Tensor], x: torch.Tensor, index: list[np.ndarray]):
    """Logits of each stacked model on its own index set (padded) → list of tensors."""
    n = len(index)
    width = max((len(i) for i in index), default=0)
    if width == 0:
        return [torch.zeros(0, model.n_classes) for _ in index]
    pad = np.zeros((n, width), dtype=np.int64)
    for k, i in enumerate(index):
        pad[k, : len(i)] = i
    logits = model.forward(params, x[torch.as_tensor(pad, device=x.device)], None)
    return [logits[k, : len(i)] for k, i in enumerate(index)]


def _scores(logits: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    if len(y) == 0:
        return {"accuracy": float("nan"), "loss": float("nan"), "n": 0}
    loss = F.cross_entropy(logits, y, reduction="sum").item()
    correct = (logits.argmax(-1) == y).sum().item()
    return {"accuracy": correct / len(y), "loss_sum": loss, "loss": loss / len(y), "n": len(y)}


def _stat(values, fn, *args) -> float:
    """A nan-aware statistic that is NaN (not a warning) when nothing was measured."""
    v = np.asarray(values, dtype=float)
    v = v[~np.isnan(v)]
    return float(fn(v, *args)) if len(v) else float("nan")


def _chunks(n: int, size: int):
    for start in range(0, n, size):
        yield list(range(start, min(n, start + size)))


@torch.no_grad()
def evaluate(
    algo: Algorithm,
    server: ServerState,
    states: dict[int, ClientState],
    fed,
    x_pool: torch.Tensor,
    y_pool: torch.Tensor,
    x_global: torch.Tensor,
    y_global: torch.Tensor,
    max_floats: int = 50_000_000,
    clients: list[int] | None = None,
) -> Evaluation:
    """All metrics of one evaluation (see the module docstring).

    ``clients`` restricts the per-client metrics to a subset (e.g. a sample of
    20, as the FedMoE paper reports); per-client lists follow its order.
    """
    ids = list(range(fed.n_clients)) if clients is None else list(clients)
    n_clients = len(ids)
    binary = fed.n_classes == 2
    d = int(np.prod(x_pool.shape[1:]))
    per_client: dict[str, list[float]] = {"local_accuracy": [], "local_loss": [], "val_loss": [], "val_accuracy": []}
    if binary:
        per_client["local_auc"] = []
    if algo.personalised:
        per_client["global_accuracy"] = []
        per_client["global_loss"] = []
    val_loss_sum = val_correct = val_n = 0.0
    longest = max(len(x_global), *(len(fed.test[k]) for k in ids), *(len(fed.val[k]) for k in ids), 1)
    chunk = max(1, max_floats // (longest * max(d, algo.model.n_classes)))
    global_logits_sum = None
    for positions in _chunks(n_clients, chunk):
        clients = [ids[i] for i in positions]
        local = [split_state(states[k])[0] for k in clients]
        params = algo.eval_params(server, stack_states(local), len(clients))
        tests = predict(algo.model, params, x_pool, [fed.test[k] for k in clients])
        vals = predict(algo.model, params, x_pool, [fed.val[k] for k in clients])
        for j, k in enumerate(clients):
            yt = y_pool[torch.as_tensor(fed.test[k], device=y_pool.device)]
            s = _scores(tests[j], yt)
            per_client["local_accuracy"].append(s["accuracy"])
            per_client["local_loss"].append(s["loss"])
            if binary:
                per_client["local_auc"].append(_auc(yt.cpu().numpy(), tests[j].softmax(-1)[:, 1].cpu().numpy()) if len(yt) else float("nan"))
            yv = y_pool[torch.as_tensor(fed.val[k], device=y_pool.device)]
            v = _scores(vals[j], yv)
            per_client["val_loss"].append(v["loss"])
            per_client["val_accuracy"].append(v["accuracy"])
            if v["n"] and not fed.opted_out[k]:  # opted-out data must not pick the global model
                val_loss_sum += v["loss_sum"]
                val_correct += v["accuracy"] * v["n"]
                val_n += v["n"]
        if algo.personalised:
            full = np.arange(len(y_global))
            glob = predict(algo.model, params, x_global, [full] * len(clients))
            for j in range(len(clients)):
                s = _scores(glob[j], y_global)
                per_client["global_accuracy"].append(s["accuracy"])
                per_client["global_loss"].append(s["loss"])
                probs = glob[j].softmax(-1)
                global_logits_sum = probs if global_logits_sum is None else global_logits_sum + probs

    local = np.asarray(per_client["local_accuracy"], dtype=float)
    metrics: dict[str, float] = {
        "local_accuracy_mean": _stat(local, np.mean),
        "local_accuracy_std": _stat(local, np.std),
        "local_accuracy_p10": _stat(local, np.percentile, 10),
        "local_accuracy_p50": _stat(local, np.percentile, 50),
        "local_accuracy_p90": _stat(local, np.percentile, 90),
        "local_loss_mean": _stat(per_client["local_loss"], np.mean),
        "val_loss": val_loss_sum / val_n if val_n else float("nan"),
        "val_accuracy": val_correct / val_n if val_n else float("nan"),
    }
    if binary:
        metrics["local_auc_mean"] = _stat(per_client["local_auc"], np.mean)
    if np.asarray(fed.opted_out).any():  # do the clients who keep their data out still benefit?
        out = np.asarray(fed.opted_out, dtype=bool)[ids]
        metrics["local_accuracy_opted_in_mean"] = _stat(local[~out], np.mean)
        metrics["local_accuracy_opted_out_mean"] = _stat(local[out], np.mean)
    if algo.has_global_model:
        logits = algo.model.forward(algo.global_params(server), x_global.unsqueeze(0), None)[0]
        s = _scores(logits, y_global)
        key = "server" if algo.personalised else "global"
        metrics[f"{key}_accuracy"] = s["accuracy"]
        metrics[f"{key}_loss"] = s["loss"]
        if binary:
            metrics[f"{key}_auc"] = _auc(y_global.cpu().numpy(), logits.softmax(-1)[:, 1].cpu().numpy())
    if algo.personalised:
        metrics["global_accuracy"] = float(np.mean(per_client["global_accuracy"]))
        metrics["global_loss"] = float(np.mean(per_client["global_loss"]))
        if binary:
            metrics["global_auc"] = _auc(y_global.cpu().numpy(), (global_logits_sum / n_clients)[:, 1].cpu().numpy())
    return Evaluation(metrics, per_client)
