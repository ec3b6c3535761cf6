"""Does FedMoE's gate route the classes a client lacks to the frozen global expert?

The paper's argument for the mixture over fine-tuning is that the gate keeps the
global model's general knowledge: on the classes a client rarely sees, ``h(x)``
should fall and the frozen FedAvg expert answer. This script reads finished runs
of ``configs/paper/fedmoe_table1_fmnist.yaml`` (their saved global model and each
evaluated client's specialist and gate) and, per evaluated client, splits the
balanced global test set into the client's **own** classes (share of its training
labels above 1/C — the majority classes of a ``majority`` split) and the
**other** classes, then reports:

- each personal model's accuracy on the client's own test data (``*_local``, the
  paper's local metric) and, on the global test set, on own / other classes of FedAvg, the fine-tuned model and the
  mixture;
- the gate's mean ``h`` (the specialist's weight) on own / other classes, and the
  AUC of ``h`` as a detector of own-class samples (0.5: the gate does not tell them apart);
- ``mixture_minus_finetuned``: the paired difference on the whole global test set
  (its CI over runs is the paired CI of the paper's headline claim);
- *routed*: the accuracy a perfect router would get — the fine-tuned model on own
  classes, FedAvg on the others — the ceiling of the paper's argument.

Computed from the saved models with hetfed's public API (``hetfed.open_run``,
``Run.model``, ``Federation``), independently of the engine's evaluation.

``--lr LR`` re-runs the personal phases (Local, fine-tuning, mixture) of the same
evaluated clients from the run's saved global model with the fine-tuning/mixture
learning rate set to ``LR`` (the paper's: 1e-5), everything else as configured,
and reports those models instead: does the gate learn to route when it can move?
With the run's own lr it reproduces the run's models (``mixture_all`` equals the
run's ``global_accuracy`` for the mixture).

    python results/paper/fedmoe_routing.py RUN_DIR [RUN_DIR ...] [--lr LR] [--markdown]

A ``RUN_DIR`` is one seed's run (``…/partition.p=0.8/seed=0``); several are
summarised as mean ± 95% CI over runs (the per-run value is the mean over its
evaluated clients).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from scipy import stats

import hetfed
from hetfed.engine.types import Broadcast

COLUMNS = ("finetuned_local", "mixture_local", "fedavg_own", "fedavg_other", "finetuned_own", "finetuned_other",
           "mixture_own", "mixture_other",
           "routed_all", "mixture_all", "finetuned_all", "mixture_minus_finetuned", "gate_own", "gate_other",
           "gate_auc")


def own_classes(y_train: np.ndarray, n_classes: int) -> np.ndarray:
    """The classes whose share of a client's training labels is above uniform (1/C)."""
    share = np.bincount(y_train, minlength=n_classes) / max(len(y_train), 1)
    return np.flatnonzero(share > 1.0 / n_classes)


def _auc(positive: np.ndarray, score: np.ndarray) -> float:
    """P(score of an own-class sample > score of an other-class one), ties half (Mann–Whitney)."""
    if positive.all() or not positive.any():
        return float("nan")
    ranks = stats.rankdata(score)
    n1, n0 = positive.sum(), (~positive).sum()
    return float((ranks[positive].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def run_routing(run_dir: Path, lr: float | None = None) -> list[dict[str, float]]:
    """One row per evaluated client of one run (``lr``: re-run the personal phases at this lr first)."""
    run = hetfed.open_run(run_dir)
    fed = hetfed.build_federation(run.config)
    x, y = fed.global_test()
    fedavg, finetuned, mixture = (run.model(v) for v in ("fedavg", "finetuned", "mixture"))
    if lr is not None:
        finetuned, mixture = repersonalise(run, fed, fedavg, lr)
    pred_global = fedavg.predict(x)
    rows = []
    for k in mixture.clients:
        own = own_classes(fed.client_data(k, "train")[1], fed.n_classes)
        is_own = np.isin(y, own)
        p_ft = finetuned.predict(x, client=k)
        p_mx = mixture.predict(x, client=k)
        row = {"client": k}
        for name, p in (("fedavg", pred_global), ("finetuned", p_ft), ("mixture", p_mx)):
            hit = p == y
            row[f"{name}_own"] = float(hit[is_own].mean())
            row[f"{name}_other"] = float(hit[~is_own].mean())
            row[f"{name}_all"] = float(hit.mean())
        row["routed_all"] = float(np.where(is_own, p_ft == y, pred_global == y).mean())
        x_local, y_local = fed.client_data(k, "test")
        row["finetuned_local"] = float((finetuned.predict(x_local, client=k) == y_local).mean())
        row["mixture_local"] = float((mixture.predict(x_local, client=k) == y_local).mean())
        row["mixture_minus_finetuned"] = row["mixture_all"] - row["finetuned_all"]
        h = gate(mixture, k, x)
        row["gate_own"] = float(h[is_own].mean())
        row["gate_other"] = float(h[~is_own].mean())
        row["gate_auc"] = _auc(is_own, h)
        rows.append(row)
    return rows


def repersonalise(run, fed, fedavg: hetfed.Model, lr: float) -> tuple[hetfed.Model, hetfed.Model]:
    """The run's evaluated clients' personal phases again, from its saved global model, at ``lr``."""
    from dataclasses import replace

    from hetfed.algorithms import run_for
    from hetfed.config import build_config
    from hetfed.engine.types import OPT_PREFIX, ServerState
    from hetfed.executors.inprocess import VectorisedExecutor

    raw = run.config.model_dump(mode="json")
    (method,) = [m for m in raw["methods"] if m["algorithm"] == "fedmoe"]
    method["params"]["optimizer"]["lr"] = lr
    cfg = build_config(raw)
    inner = fed._prepared.federation
    spec = run_for(cfg, cfg.methods[raw["methods"].index(method)], inner)
    algo = spec.algo
    executor = VectorisedExecutor()
    executor.start(spec, inner, torch.device("cpu"))
    best_round = int(run.summary["methods"]["fedavg"].get("best_round") or 0)
    clients = algo.personal_plan(inner, cfg.seed).clients
    executor.personalise(algo.broadcast(ServerState(fedavg.shared, best_round), best_round), clients)
    ids, stacked = executor.states.stacked(keep=lambda name: not name.startswith(OPT_PREFIX))
    states = {"client_ids": ids, "states": stacked}
    return (replace(fedavg, method="finetuned", algorithm=algo, client_states=states, view="finetuned"),
            replace(fedavg, method="mixture", algorithm=algo, client_states=states, view="mixture"))


@torch.no_grad()
def gate(model: hetfed.Model, client: int, x: np.ndarray) -> np.ndarray:
    """h(x) of one client's mixture: the specialist's weight per sample."""
    algo = model.algorithm
    row = model.clients.index(client)
    states = {k: v[row: row + 1] for k, v in model.client_states["states"].items()}
    pred = algo.predictor(Broadcast(model.shared, 0, 0.0), states, 1, "mixture")
    xt = torch.as_tensor(np.asarray(x, dtype=np.float32)).unsqueeze(0)
    return pred.model.gate_value(pred.params, xt)[0, :, 0].cpu().numpy()


def summary(per_run: list[list[dict[str, float]]]) -> dict[str, tuple[float, float]]:
    """Mean ± 95% CI (Student t) over runs of each run's mean over its clients."""
    out = {}
    for col in COLUMNS:
        v = np.array([np.nanmean([r[col] for r in rows]) for rows in per_run])
        half = float(stats.t.ppf(0.975, len(v) - 1) * v.std(ddof=1) / np.sqrt(len(v))) if len(v) > 1 else float("nan")
        out[col] = (float(v.mean()), half)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--lr", type=float, default=None,
                    help="re-run the personal phases at this fine-tuning/mixture lr (the paper's: 1e-5)")
    ap.add_argument("--markdown", action="store_true", help="one markdown row of mean ± CI instead of per-run rows")
    args = ap.parse_args(argv)
    per_run = []
    for d in args.runs:
        rows = run_routing(d, args.lr)
        per_run.append(rows)
        if not args.markdown:
            means = {c: np.nanmean([r[c] for r in rows]) for c in COLUMNS}
            print(d, " ".join(f"{c}={means[c]:.3f}" for c in COLUMNS), flush=True)
    s = summary(per_run)
    print("| " + " | ".join(COLUMNS) + " | runs |")
    print("|" + "---|" * (len(COLUMNS) + 1))
    print("| " + " | ".join(f"{m:.3f} ± {h:.3f}" for m, h in s.values()) + f" | {len(per_run)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
