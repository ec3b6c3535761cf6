"""What PFLlib's pFedMe reports as its "personalized" accuracy, measured by running PFLlib's own server and clients
(``flcore.servers.serverpFedMe.pFedMe``, ``flcore.clients.clientpFedMe``) on a toy federation written in PFLlib's
file format (``dataset/<name>/{train,test}/<client>.npz``), at PFLlib's pFedMe defaults (λ 1, K 5, η_p 0.01, lr
0.005, B 10, E 1) and β = 0 (PFLlib's default ``--beta``) and 1.

At every evaluation the script also scores, by PFLlib's rule (total correct / total test samples), the server's
model (``server.global_model``, which PFLlib has just sent to the clients) and the clients' personal models θ as their
last round's training left them (read inside PFLlib's ``train``, before it overwrites them). Prints JSON.

    python results/pfllib_code/pfedme_evaluation.py PFLLIB_CHECKOUT [--rounds 20]

PFLLIB_CHECKOUT: a checkout of https://github.com/TsingZ0/PFLlib (its ``system/`` folder is imported; nothing is
downloaded). Needs torch, numpy, scikit-learn and h5py (PFLlib's imports).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import numpy as np
import torch
from torch import nn

CLIENTS, CLASSES, FEATURES = 4, 4, 20


def write_federation(root: Path) -> None:
    """Four label-skewed clients of four Gaussian classes, 120 train and 120 test rows each, as PFLlib stores them."""
    rng = np.random.default_rng(0)
    centres = rng.normal(size=(CLASSES, FEATURES)) * 1.5
    for split in ("train", "test"):
        (root / "dataset" / "toy" / split).mkdir(parents=True, exist_ok=True)
        for k in range(CLIENTS):
            y = rng.choice(CLASSES, size=120, p=np.roll([0.7, 0.2, 0.05, 0.05], k))
            x = (centres[y] + rng.normal(size=(120, FEATURES))).astype(np.float32)
            np.savez(root / "dataset" / "toy" / split / f"{k}.npz", data={"x": x, "y": y})


def pfllib_args(beta: float, rounds: int) -> types.SimpleNamespace:
    """What PFLlib's main.py hands its server, at main.py's defaults where pFedMe reads them."""
    torch.manual_seed(0)
    return types.SimpleNamespace(
        model=nn.Linear(FEATURES, CLASSES), algorithm="pFedMe", dataset="toy", device="cpu", num_classes=CLASSES,
        global_rounds=rounds, local_epochs=1, batch_size=10, local_learning_rate=0.005, learning_rate_decay=False,
        learning_rate_decay_gamma=0.99, num_clients=CLIENTS, join_ratio=1.0, random_join_ratio=False, few_shot=0,
        time_select=False, goal="test", time_threthold=10000, save_folder_name="items", top_cnt=100,
        auto_break=False, eval_gap=1, client_drop_rate=0.0, train_slow_rate=0.0, send_slow_rate=0.0,
        dlg_eval=False, dlg_gap=100, batch_num_per_client=2, num_new_clients=0, fine_tuning_epoch_new=0,
        beta=beta, lamda=1.0, K=5, p_learning_rate=0.01)


def correct(model: nn.Module, root: Path, k: int) -> tuple[int, int]:
    """A model's correct predictions on client ``k``'s test file, and the file's rows."""
    data = np.load(root / "dataset" / "toy" / "test" / f"{k}.npz", allow_pickle=True)["data"].tolist()
    with torch.no_grad():
        return int((model(torch.tensor(data["x"])).argmax(1) == torch.tensor(data["y"])).sum()), len(data["y"])


def pooled(counts: list[tuple[int, int]]) -> float:
    """Total correct / total test rows over clients' (correct, rows): PFLlib's rule."""
    return sum(c for c, _ in counts) / sum(n for _, n in counts)


def accuracy(model: nn.Module, root: Path) -> float:
    """A model's accuracy on every client's test file, by PFLlib's rule."""
    return pooled([correct(model, root, k) for k in range(CLIENTS)])


def record_theta(client: object, root: Path, seen: dict[int, tuple[int, int]]) -> None:
    """Each round, client's personal model θ on its own test file, read where PFLlib's ``train`` ends: its last
    call, ``update_parameters(self.model, self.local_params)``, replaces the model's parameters (θ, the personal
    model pFedMe's optimiser stepped) with the local model w."""
    update = client.update_parameters

    def update_parameters(model: nn.Module, new_params: list) -> None:
        if new_params is client.local_params:
            seen[client.id] = correct(model, root, client.id)
        update(model, new_params)

    client.update_parameters = update_parameters


def run(beta: float, rounds: int, root: Path) -> dict[str, object]:
    from flcore.servers.serverpFedMe import pFedMe  # PFLlib's own

    random.seed(0)  # PFLlib draws its clients' order with Python's and numpy's generators, unseeded
    np.random.seed(0)
    args = pfllib_args(beta, rounds)
    initial = accuracy(args.model, root)
    with contextlib.redirect_stdout(io.StringIO()):
        server = pFedMe(args, 0)
    server_model: list[float] = []
    theta: list[float] = []
    last: dict[int, tuple[int, int]] = {}
    for client in server.clients:
        record_theta(client, root, last)
    evaluate = server.evaluate_personalized

    def evaluated() -> None:  # PFLlib evaluates right after send_models, before the round's training
        server_model.append(accuracy(server.global_model, root))
        if last:  # the personal models the clients' last training ended with
            theta.append(pooled(list(last.values())))
        evaluate()

    server.evaluate_personalized = evaluated
    server.save_results = server.save_global_model = lambda: None  # no files
    with contextlib.redirect_stdout(io.StringIO()):
        server.train()
    reported = [float(a) for a in server.rs_test_acc_per]
    return {"beta": beta, "initial_model_accuracy": initial, "reported_personalized_accuracy": reported,
            "server_model_accuracy_at_each_evaluation": server_model,
            "reported_equals_server_model": reported == server_model, "best_reported": max(reported),
            "personal_model_theta_accuracy_after_each_round": theta, "best_theta": max(theta)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("pfllib", type=Path, help="a checkout of TsingZ0/PFLlib")
    ap.add_argument("--rounds", type=int, default=20)
    args = ap.parse_args()
    commit = subprocess.run(["git", "-C", str(args.pfllib), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or None
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shutil.copytree(args.pfllib / "system", root / "system")
        write_federation(root)
        os.chdir(root / "system")  # PFLlib reads ../dataset/<name>/ from its system/ folder
        sys.path.insert(0, str(root / "system"))
        results = [run(beta, args.rounds, root) for beta in (0.0, 1.0)]
    print(json.dumps({"pfllib_commit": commit, "rounds": args.rounds, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
