"""Γ beside the rounds, or before them (#74 §2): would measuring a run's heterogeneity on a thread while its rounds
train save the time it takes?

A run measures Γ (with its IID reference and Γ(x|y)) before its first round, and a stacked sweep's runs prepare in
turn (``Rendezvous.turn``). On a host whose cores the rounds leave idle (a GPU's), Γ beside the rounds would cost no
wall time; on a CPU the two compete for the same cores. This times, in one process, on Fashion-MNIST's 20
Dirichlet-0.1 clients (``configs/leaderboard_fmnist.yaml``, ``HETFED_DATA`` pointing at the files): Γ alone
(``measure``), the run's rounds alone (``run_experiment`` with the preparation given), the two one after the other
(their sum) and the two at once (Γ on a thread, started with the rounds). JSON out; nothing asserted.

    HETFED_DATA=.data python benchmarks/gamma_beside.py [--rounds 20] [--device cpu|cuda] [--config FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
import warnings
from pathlib import Path

import torch

from hetfed.config import load_config
from hetfed.heterogeneity import measure
from hetfed.pipeline import prepare
from hetfed.runs.runner import run_experiment

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "leaderboard_fmnist.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--config", default=str(CONFIG), help="the experiment (default: leaderboard_fmnist.yaml)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    config = load_config(args.config, [f"train.rounds={args.rounds}", f"train.device={args.device}",
                                  "partition.clients=20", "train.checkpoint_every=null",
                                  "methods=[{name: fedavg, algorithm: fedavg}, {name: fedprox, algorithm: fedprox}]"])
    prep = prepare(config, progress=False)
    fed, h = prep.federation, config.heterogeneity

    def gamma() -> None:
        clients = [fed.measured_rows(k, h.on) for k in range(fed.n_clients)]
        measure(fed.x, fed.y, clients, fed.n_classes, iid_draws=h.iid_draws, iid_max_clients=h.iid_max_clients,
                estimator=h.estimator, measured_on=h.on, seed=config.seed, given_label=h.given_label)

    def rounds() -> None:
        run_experiment(config, out=Path(tempfile.mkdtemp()) / "run", progress=False, prepared=prep)

    def timed(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    gamma_s, rounds_s = timed(gamma), timed(rounds)

    def both() -> None:
        beside = threading.Thread(target=gamma)
        beside.start()
        rounds()
        beside.join()

    both_s = timed(both)
    print(json.dumps({"config": Path(args.config).name, "rounds": args.rounds, "device": args.device,
                      "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "gamma_s": round(gamma_s, 2),
                      "rounds_s": round(rounds_s, 2), "one_after_the_other_s": round(gamma_s + rounds_s, 2),
                      "at_once_s": round(both_s, 2), "at_once_over_one_after_the_other":
                      round(both_s / (gamma_s + rounds_s), 3)}, indent=2))


if __name__ == "__main__":
    main()
