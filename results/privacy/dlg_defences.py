"""DLG and iDLG against what each protocol hands an honest-but-curious server, on scikit-learn's digits (#76).

    python results/privacy/dlg_defences.py > results/privacy/dlg_defences.json

Per seed: one digit image (a different one per seed), an MLP 64-64-64-10 at a random initialisation (the model a
client receives in round 1), the client's update from that model; the attack (30 L-BFGS steps) is scored by PSNR
of its reconstruction against the client's image (for a batch: each real image against its best-matching
reconstruction), and by labels recovered. Settings: FedSGD (one step on the one sample), FedAvg's local update
(5 steps on a batch of 5 with the sample first), the decoded update under QSGD 8-bit / 2-bit and top-k 10 %,
noise of 10 % of the update's norm added by the client, and SecAgg+ over 4 FedSGD clients (only their mean).
"""

from __future__ import annotations

import json
import math
import sys

import numpy as np
import torch
from sklearn.datasets import load_digits

from hetfed.leakage import compressed, observe_local, observe_step, run, summed
from hetfed.leakage.metrics import labels_recovered
from hetfed.models.mlp import MLP

SEEDS = 5


def best_psnr(truth: np.ndarray, guess: np.ndarray) -> float:
    """Each real sample against the reconstruction closest to it, averaged (a batch's order is not recoverable)."""
    out = []
    for t in truth:
        mse = [float(np.mean((t - np.clip(g, 0, 1)) ** 2)) for g in guess]
        out.append(10 * math.log10(1 / max(min(mse), 1e-12)))
    return float(np.mean(out))


def main() -> None:
    d = load_digits()
    x, y = torch.tensor(d.images / 16.0, dtype=torch.float32), torch.tensor(d.target)
    rows: dict[str, list[dict[str, float]]] = {}
    for seed in range(SEEDS):
        model = MLP(64, [64, 64], 10)
        params = model.init_shared(torch.Generator().manual_seed(100 + seed))
        i = 17 * seed + 3
        one = observe_step(model, params, x[i:i + 1], y[i:i + 1], lr=0.1)
        settings = {
            "fedsgd": one,
            "fedavg_5_steps": observe_local(model, params, x[i:i + 5], y[i:i + 5], lr=0.1, steps=5, batch=5),
            "qsgd_8bit": compressed(one, {"kind": "qsgd", "bits": 8}, seed),
            "qsgd_2bit": compressed(one, {"kind": "qsgd", "bits": 2}, seed),
            "topk_10pct": compressed(one, {"kind": "topk", "fraction": 0.1}, seed),
            "secagg_4_clients": summed([observe_step(model, params, x[j:j + 1], y[j:j + 1], lr=0.1)
                                        for j in (i, i + 400, i + 800, i + 1200)]),
        }
        gen = torch.Generator().manual_seed(seed)
        norm = torch.sqrt(sum((v ** 2).sum() for v in one.update.values()))
        count = sum(v.numel() for v in one.update.values())
        settings["client_noise_10pct"] = type(one)(one.model, one.params, {
            k: v + 0.1 * norm / math.sqrt(count) * torch.randn(v.shape, generator=gen) for k, v in one.update.items()},
            one.lr, one.input_shape)
        for name, observed in settings.items():
            truth_x = x[i:i + 1] if name != "secagg_4_clients" else x[[i, i + 400, i + 800, i + 1200]]
            truth_y = y[i:i + 1] if name != "secagg_4_clients" else y[[i, i + 400, i + 800, i + 1200]]
            if name == "fedavg_5_steps":
                truth_x, truth_y = x[i:i + 5], y[i:i + 5]
            for attack in ("dlg", "idlg"):
                if attack == "idlg" and observed.batch != 1:
                    continue
                found = run(attack, observed, seed=seed)
                rows.setdefault(f"{name}/{attack}", []).append({
                    "psnr": best_psnr(truth_x.numpy(), found.x.numpy()),
                    "labels": labels_recovered(truth_y.numpy(), found.y.numpy())})
    table = {k: {"psnr_mean": float(np.mean([r["psnr"] for r in v])), "psnr_std": float(np.std([r["psnr"] for r in v])),
                 "labels_mean": float(np.mean([r["labels"] for r in v])), "seeds": len(v)} for k, v in rows.items()}
    json.dump({"command": "python results/privacy/dlg_defences.py", "seeds": SEEDS, "table": table, "runs": rows},
              sys.stdout, indent=1)


if __name__ == "__main__":
    main()
