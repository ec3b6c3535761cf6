"""How hetfed scales with the number of clients: seconds per round, evaluation seconds, peak memory.

Fashion-MNIST-sized synthetic data (784 features, 10 classes, 10 000 global test
images; N = max(60 000, 2·K) training samples so every client has some), an IID
split, the issue's MLP 784-200-200-10 (FedAvg) and a CGAU net of the same shape
(per-client conditioning rows: local state for every client), E = 1, B = 32,
default settings otherwise. Every setting runs in its own process, so its peak
RSS (``ru_maxrss``) is its own. Measured, never asserted.

    python benchmarks/scale.py [--clients 100 1000 10000 100000] [--fractions 1.0 0.01]
                               [--methods fedavg cgau] [--rounds 2] [--device cpu] [--mmap-threshold BYTES]
                               [--no-norm-filter] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import numpy as np


def federation(n_clients: int, seed: int = 0):
    """A synthetic FMNIST-shaped federation: class means in 784-d, IID clients of 60/20/20 train/val/test."""
    from hetfed.partition import Federation

    rng = np.random.default_rng(seed)
    n = max(60_000, 2 * n_clients)
    means = rng.normal(0, 1, (10, 784)).astype(np.float32)
    y = rng.integers(0, 10, n).astype(np.int64)
    x = np.empty((n, 784), dtype=np.float32)  # in blocks: no float64 temporaries of the whole pool
    for start in range(0, n, 20_000):
        stop = min(start + 20_000, n)
        x[start:stop] = means[y[start:stop]] + rng.standard_normal((stop - start, 784), dtype=np.float32) * 2
    yg = np.repeat(np.arange(10), 1000)
    xg = means[yg] + rng.normal(0, 2, (len(yg), 784)).astype(np.float32)
    parts = np.array_split(rng.permutation(n), n_clients)
    train, val, test = [], [], []
    for p in parts:
        a, b = max(1, int(0.6 * len(p))), max(1, int(0.8 * len(p)))
        train.append(np.sort(p[:a]))
        val.append(np.sort(p[a:b]))
        test.append(np.sort(p[b:]))
    return Federation(x, y, tuple(train), tuple(val), tuple(test), xg, yg.astype(np.int64), 10,
                      np.zeros(n_clients, dtype=bool), (784,), "iid", {})


def one(n_clients: int, fraction: float, method: str, rounds: int, device: str, norm_filter: bool = True) -> dict:
    """One setting, in this process: build, run ``rounds`` rounds (evaluating after the last), measure."""
    import torch

    from hetfed.algorithms import build_algorithm
    from hetfed.config import ModelConfig, ServerConfig, TrainConfig
    from hetfed.engine.host_memory import keep_freed_memory
    from hetfed.executors.simulate import simulate
    from hetfed.models import build_model

    t0 = time.perf_counter()
    fed = federation(n_clients)
    # the default norm filter holds only its reference clients; the rest of a round streams (#29)
    train = TrainConfig(rounds=rounds, client_fraction=fraction, eval_every=rounds, device=device,
                        batch_size=32, local_epochs=1.0)
    model = build_model(ModelConfig(kind="cgau" if method == "cgau" else "mlp", hidden=[200, 200]), (784,), 10)
    server = ServerConfig(screen={"norm_factor": 10.0 if norm_filter else None})
    algo = build_algorithm("fedavg", model, train, server=server)
    build_s = time.perf_counter() - t0
    kept = keep_freed_memory()  # as a hetfed run does (HETFED_MALLOC=off, or --mmap-threshold: glibc's settings)
    result = simulate(algo, fed, train, seed=0)
    ev = result.history[-1][1].metrics
    return {
        "clients": n_clients, "fraction": fraction, "method": method, "device": device,
        "sampled_per_round": max(1, round(fraction * n_clients)),
        "seconds_per_round": result.train_seconds / result.rounds_done,
        "server_seconds_per_round": result.server_seconds / result.rounds_done,
        "eval_seconds": result.eval_seconds / max(result.evaluations, 1),
        "build_seconds": build_s,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "client_state_mb": result.executor.states.nbytes() / 2**20,
        "global_accuracy": ev.get("global_accuracy"),
        "torch_threads": torch.get_num_threads(),
        "norm_filter": norm_filter,
        "malloc_kept": kept,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 1000, 10000, 100000])
    parser.add_argument("--fractions", type=float, nargs="+", default=[1.0, 0.01])
    parser.add_argument("--methods", nargs="+", default=["fedavg", "cgau"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-norm-filter", action="store_true",
                        help="server.screen.norm_factor: null (the default filter is on and holds 32 updates a round)")
    parser.add_argument("--mmap-threshold", type=int, default=None, metavar="BYTES",
                        help="fix glibc's MALLOC_MMAP_THRESHOLD_ in the measured processes (e.g. 1048576): freed "
                        "chunk memory then goes back to the system, so peak RSS shows what hetfed holds (~2x slower)")
    parser.add_argument("--one", nargs=4, metavar=("K", "FRACTION", "METHOD", "ROUNDS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        k, f, m, r = args.one
        print(json.dumps(one(int(k), float(f), m, int(r), args.device, not args.no_norm_filter)))
        return
    rows = []
    for method in args.methods:
        for k in args.clients:
            for f in args.fractions:
                cmd = [sys.executable, __file__, "--device", args.device, "--one", str(k), str(f), method,
                       str(args.rounds), *(["--no-norm-filter"] if args.no_norm_filter else [])]
                env = dict(os.environ, **({"MALLOC_MMAP_THRESHOLD_": str(args.mmap_threshold)}
                                          if args.mmap_threshold else {}))
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if proc.returncode != 0:
                    row = {"clients": k, "fraction": f, "method": method,
                           "error": proc.stderr.strip().splitlines()[-1:]}
                else:
                    row = {**json.loads(proc.stdout.strip().splitlines()[-1]),
                           "mmap_threshold": args.mmap_threshold}
                rows.append(row)
                # a line per case as it finishes (--json: the whole table at the end)
                print(json.dumps(row), flush=True)
    base = {(r["method"], r["fraction"]): r for r in rows if r.get("clients") == min(args.clients) and "error" not in r}
    for r in rows:
        b = base.get((r["method"], r["fraction"]))
        if b and "error" not in r:
            r["peak_rss_vs_smallest"] = r["peak_rss_mb"] / b["peak_rss_mb"]
            r["eval_vs_round"] = r["eval_seconds"] / max(r["seconds_per_round"], 1e-9)
    if args.json:
        print(json.dumps({"rows": rows}, indent=1))


if __name__ == "__main__":
    main()
