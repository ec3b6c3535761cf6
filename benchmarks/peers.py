"""hetfed next to PFLlib's own training loop on the same federation, measured in one run (#47 §6).

The workload of ``benchmarks/unequal.py`` (24 000 × 784 synthetic samples of Fashion-MNIST's shape, Dirichlet
α = 0.1 over 20 clients, MLP 784-200-10, E = 1, B = 10, SGD without momentum, every client every round), run by:

- hetfed's sequential and vectorised executors (FedAvg, Ditto λ = 0.1, one personal epoch);
- PFLlib's own classes, driven as its servers drive them: ``clientAVG.train()`` per client then
  ``Server.aggregate_parameters``'s sample-weighted sum (FedAvg); ``clientDitto.ptrain()`` then ``train()`` (Ditto).
  The clients read the federation from PFLlib's own format (``dataset/<name>/train/<id>.npz``, written here) with
  PFLlib's ``read_client_data`` and DataLoader (``drop_last=True``, as PFLlib does), on PFLlib's ``FedAvgMLP``
  (``--model cnn4``: its ``FedAvgCNN``, the leaderboard's model, on the same samples as 1 × 28 × 28 images).

- pfl-research's simulated backend (``--pfl``, ``pip install --no-deps pfl==0.6.0 prv-accountant multiprocess``):
  its ``FederatedAveraging`` on a ``SimulatedBackend`` over a ``FederatedDataset`` of the same clients (its own
  ``Dataset`` batching, ``PyTorchModel`` with a plain SGD local optimiser and central SGD lr 1 on the averaged
  difference), every client every central iteration, no evaluation (FedAvg only: pfl-research has no Ditto).

PFLlib is not a package: pass the ``system`` folder of a checkout (``git clone
https://github.com/TsingZ0/PFLlib``) as ``--pfllib``. Seconds per round are the training loop's only (no
evaluation) and the ratios come from the same run. Timings are never asserted.

    python benchmarks/peers.py --pfllib PFLlib/system [--pfl] [--rounds 2] [--threads 2] [--device cpu|cuda]
                               [--model mlp|cnn4] [--samples 24000] [--algorithms fedavg ditto] [--compile]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from engine import cpu_name  # this folder is on sys.path
from unequal import federation, run

from hetfed.executors.inprocess import SequentialExecutor, VectorisedExecutor


def write_pfllib_dataset(fed, root: Path, name: str, images: bool = False) -> None:
    """The federation in PFLlib's layout: one ``{'data': {'x', 'y'}}`` npz per client, train and test
    (``images``: x as [n, 1, 28, 28], as PFLlib's image datasets store it)."""
    for split in ("train", "test"):
        (root / name / split).mkdir(parents=True, exist_ok=True)
    x, y = np.asarray(fed.x, dtype=np.float32), np.asarray(fed.y, dtype=np.int64)
    if images:
        x = x.reshape(-1, 1, 28, 28)
    for k, idx in enumerate(fed.train):
        for split in ("train", "test"):
            with open(root / name / split / f"{k}.npz", "wb") as fh:
                np.savez_compressed(fh, data={"x": x[idx], "y": y[idx]})


def pfllib_round_seconds(system: Path, fed, rounds: int, algorithm: str, device: str = "cpu",
                         model_kind: str = "mlp") -> float:
    """Seconds per round of PFLlib's own client loop (its classes, its data loading) on ``fed``."""
    sys.path.insert(0, str(system))
    from flcore.clients.clientavg import clientAVG
    from flcore.clients.clientditto import clientDitto
    from flcore.trainmodel.models import FedAvgCNN, FedAvgMLP

    work = Path(tempfile.mkdtemp())
    write_pfllib_dataset(fed, work / "dataset", "hetfed_bench", images=model_kind == "cnn4")
    model = (FedAvgCNN(1, fed.n_classes, 1024) if model_kind == "cnn4"
             else FedAvgMLP(fed.input_shape[0], fed.n_classes, 200))
    (work / "system").mkdir()
    previous = os.getcwd()
    os.chdir(work / "system")  # PFLlib reads '../dataset/<name>/…'
    try:
        args = SimpleNamespace(model=model.to(device), algorithm=algorithm,
                               dataset="hetfed_bench", device=device, save_folder_name="items",
                               num_classes=fed.n_classes,
                               batch_size=10, local_learning_rate=0.005 if model_kind == "cnn4" else 0.01,
                               local_epochs=1, few_shot=0,
                               learning_rate_decay=False, learning_rate_decay_gamma=0.99, mu=0.1, plocal_epochs=1)
        cls = clientDitto if algorithm == "ditto" else clientAVG
        clients = [cls(args, k, len(idx), len(idx), train_slow=False, send_slow=False)
                   for k, idx in enumerate(fed.train)]
        global_model = copy.deepcopy(args.model)
        seconds = []
        for _ in range(rounds + 1):  # the first round warms up
            t0 = time.perf_counter()
            for client in clients:
                client.set_parameters(global_model)
                if algorithm == "ditto":
                    client.ptrain()
                client.train()
            total = sum(c.train_samples for c in clients)
            global_model = copy.deepcopy(clients[0].model)  # Server.aggregate_parameters
            for p in global_model.parameters():
                p.data.zero_()
            for client in clients:
                for gp, cp in zip(global_model.parameters(), client.model.parameters(), strict=True):
                    gp.data += cp.data.clone() * (client.train_samples / total)
            if device == "cuda":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - t0)
        return float(np.mean(seconds[1:]))
    finally:
        os.chdir(previous)


class _PflMLP(torch.nn.Module):
    """hetfed's MLP 784-200-10 as a module with the ``loss`` and ``metrics`` pfl-research's PyTorchModel calls."""

    def __init__(self, d: int, classes: int, hidden: int = 200):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(d, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def loss(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> torch.Tensor:  # noqa: A002 (pfl's name)
        return torch.nn.functional.cross_entropy(self(x), y)

    def metrics(self, x: torch.Tensor, y: torch.Tensor, eval: bool = True) -> dict:  # noqa: A002
        from pfl.metrics import Weighted

        loss = torch.nn.functional.cross_entropy(self(x), y, reduction="sum")
        return {"loss": Weighted(float(loss), len(y))}


def pfl_round_seconds(fed, rounds: int, device: str = "cpu") -> float:
    """Seconds per central iteration of pfl-research's own FedAvg simulation on ``fed`` (MLP 784-200-10): the mean
    of iterations 1 … ``rounds`` (iteration 0 also evaluates every user before training, as pfl-research does at
    its first iteration). The clients' data are tensors on the training device, pfl-research's cheapest path."""
    os.environ["PFL_PYTORCH_DEVICE"] = device
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNTrainHyperParams
    from pfl.metrics import Metrics
    from pfl.model.pytorch import PyTorchModel

    x = torch.as_tensor(np.asarray(fed.x, dtype=np.float32), device=device)
    y = torch.as_tensor(np.asarray(fed.y, dtype=np.int64), device=device)
    users = {k: (x[torch.as_tensor(idx, device=device)], y[torch.as_tensor(idx, device=device)])
             for k, idx in enumerate(fed.train)}
    stamps: list[float] = []

    class Clock(TrainingProcessCallback):
        def on_train_begin(self, *, model):
            stamps.append(time.perf_counter())
            return Metrics()

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            if device == "cuda":
                torch.cuda.synchronize()
            stamps.append(time.perf_counter())
            return False, Metrics()

    data = FederatedDataset(lambda uid: Dataset(users[uid], user_id=uid),
                            get_user_sampler("minimize_reuse", list(users)))
    module = _PflMLP(x.shape[1], fed.n_classes).to(device)
    model = PyTorchModel(module, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(module.parameters(), lr=1.0))
    params = NNAlgorithmParams(central_num_iterations=rounds + 1, evaluation_frequency=10**6,
                               train_cohort_size=len(users), val_cohort_size=0)
    train = NNTrainHyperParams(local_batch_size=10, local_num_epochs=1, local_learning_rate=0.01)
    FederatedAveraging().run(algorithm_params=params, backend=SimulatedBackend(training_data=data, val_data=data),
                             model=model, model_train_params=train, callbacks=[Clock()],
                             send_metrics_to_platform=False)
    return float(np.mean(np.diff(stamps)[1:]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pfllib", type=Path, required=True, help="the 'system' folder of a PFLlib checkout")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--model", default="mlp", choices=["mlp", "cnn4"])
    ap.add_argument("--samples", type=int, default=24_000)
    ap.add_argument("--algorithms", nargs="+", default=["fedavg", "ditto"], choices=["fedavg", "ditto"])
    ap.add_argument("--pfl", action="store_true", help="also pfl-research's simulation (FedAvg, MLP)")
    ap.add_argument("--compile", action="store_true",
                    help="on a CPU, also hetfed's executors with train.capture compile (torch.compile)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    fed = federation(n=args.samples, images=args.model == "cnn4")
    model = "MLP 784-200-10" if args.model == "mlp" else "PFLlib's FedAvgCNN (cnn4)"
    out: dict = {"workload": f"{args.samples}x784 synthetic, Dirichlet 0.1, 20 clients, {model}, E=1, B=10",
                 "threads": args.threads, "rounds": args.rounds, "device": args.device,
                 "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None, "cpu": cpu_name()}
    for algorithm in args.algorithms:
        rows = {"pfllib": pfllib_round_seconds(args.pfllib, fed, args.rounds, algorithm, args.device, args.model)}
        if args.pfl and algorithm == "fedavg" and args.model == "mlp":
            rows["pfl_research"] = pfl_round_seconds(fed, args.rounds, args.device)
        for name, executor in (("hetfed_sequential", SequentialExecutor()),
                               ("hetfed_vectorised", VectorisedExecutor())):
            rows[name] = run(fed, executor, args.rounds, algorithm, args.device, model_kind=args.model)[0]
            if args.compile and args.device == "cpu":  # its steps compiled (train.capture: compile)
                rows[f"{name}_compiled"] = run(fed, executor, args.rounds, algorithm, args.device, capture="compile",
                                               model_kind=args.model)[0]
        out[algorithm] = {k: {"seconds_per_round": round(v, 3),
                              "speedup_vs_pfllib": round(rows["pfllib"] / v, 2)} for k, v in rows.items()}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
