"""pFedHN's server update of 20 runs (a round of 10 clients each, hypernetwork hidden 100, the authors' defaults):
each run's ``aggregate`` one after another, against ``aggregate_runs`` for all 20 in one call (#74 §1); the fastest of
3, ms. Run from the repository root: ``python results/benchmarks_cpu_2026-12-01/pfedhn_server.py logreg|mlp``.
"""

from __future__ import annotations

import sys
import time

import torch

from hetfed.algorithms import build_algorithm
from hetfed.algorithms.pfedhn import GENERATED
from hetfed.config import ModelConfig, TrainConfig
from hetfed.engine.rng import SERVER_INIT, torch_gen
from hetfed.engine.types import Upload
from hetfed.models import build_model


def fastest(f) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return round(best * 1000, 1)


def main(kind: str) -> None:
    torch.set_num_threads(2)
    model = build_model(ModelConfig(kind=kind, **({"hidden": [32]} if kind == "mlp" else {})), (64,), 10)
    train = TrainConfig(rounds=3, local_steps=3, batch_size=8)
    algos, servers, uploads = [], [], []
    for seed in range(20):
        algo = build_algorithm("pfedhn", model, train, None)
        algo.bind(type("Fed", (), {"n_clients": 10})())
        server = algo.server_init(torch_gen(seed, SERVER_INIT))
        bc = algo.broadcast(server, 0).for_clients(list(range(10)))
        params = {k[len(GENERATED):]: v + 0.01 for k, v in bc.personal.items()}
        uploads.append(Upload(list(range(10)), params, torch.ones(10), {}))
        algos.append(algo)
        servers.append(server)
    algos[0].aggregate(servers[0], uploads[0])  # warm-up (torch.optim's first use imports dynamo)
    alone = fastest(lambda: [a.aggregate(s, u) for a, s, u in zip(algos, servers, uploads, strict=True)])
    together = fastest(lambda: type(algos[0]).aggregate_runs(algos, servers, uploads))
    print(kind, "20 runs alone", alone, "ms; in one call", together, "ms")


if __name__ == "__main__":
    main(sys.argv[1])
