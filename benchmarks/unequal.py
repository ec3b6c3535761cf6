"""Unequal clients (#47 §1: only active clients compute), measured in one run on the same machine.

The field's most common setting: 20 clients of a Dirichlet α = 0.1 split (62 … thousands of samples), an MLP
784-200-10, E = 1, B = 10, every client every round, FedAvg — here on synthetic data of Fashion-MNIST's shape
(24 000 × 784, 10 classes), so it runs offline. Three executors on the same federation:

- ``sequential``: one client at a time (no padding, no stacking);
- ``vectorised_one_stack``: the round's clients in one stack, in id order (hetfed before #47: clients that
  finished their plan still compute, masked, until the longest is done);
- ``vectorised``: stacks of clients with similar numbers of steps (:func:`hetfed.engine.local.stack_blocks`).

For each: seconds per round (training only), the stack occupancy (real client-steps ÷ computed client-steps)
and the largest parameter difference from the sequential run (the executors agree to float tolerance).
Two floors, timed in the same run: the **stacked ideal** (the vectorised executor's stacks as nothing but a
batched-matmul forward, autograd backward and SGD update per step: pre-made parameters and batch order, no
sampling, planning, masking or aggregation) and the **GEMM limit** (the round's FLOPs on real rows at the rate
this machine reaches on one large matmul of the same inner dimensions).
Ratios are from one run; timings are never asserted.

    python benchmarks/unequal.py [--rounds 2] [--threads 2] [--device cpu|cuda] [--json]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from engine import (
    _Synthetic,  # benchmarks/engine.py: random inputs of a given shape (this folder is on sys.path)
)

from hetfed.algorithms import build_algorithm
from hetfed.config import ModelConfig, OptimizerConfig, PartitionConfig, TrainConfig
from hetfed.engine.local import LocalSchedule, stack_blocks, stack_occupancy
from hetfed.executors.inprocess import (
    SequentialExecutor,
    VectorisedExecutor,
    memory_chunk,
    step_overhead,
)
from hetfed.executors.simulate import simulate
from hetfed.models import build_model
from hetfed.partition import make_federation


def federation(n: int = 24_000, d: int = 784, clients: int = 20, alpha: float = 0.1):
    cfg = PartitionConfig(kind="dirichlet", clients=clients, alpha=alpha, val_fraction=0.0, test_fraction=0.0)
    return make_federation(_Synthetic(n, d), cfg, seed=0)


def run(fed, executor, rounds: int, algorithm: str = "fedavg", device: str = "cpu", capture: str = "auto"):
    model = build_model(ModelConfig(kind="mlp", hidden=[200]), fed.input_shape, fed.n_classes)
    train = TrainConfig(rounds=rounds, client_fraction=1.0, eval_every=10_000, local_epochs=1, batch_size=10,
                        optimizer=OptimizerConfig(lr=0.01, momentum=0.0), device=device, capture=capture)
    algo = build_algorithm(algorithm, model, train)
    simulate(algo, fed, train.model_copy(update={"rounds": 1}), 0, executor=executor)  # warm-up
    t0 = time.perf_counter()
    result = simulate(algo, fed, train, 0, executor=executor)
    per_round = result.train_seconds / rounds if result.train_seconds else (time.perf_counter() - t0) / rounds
    return per_round, result.server.params, model


def ideal_seconds(blocks: list[list[int]], steps: list[int], d: int, hidden: int, batch: int = 10,
                  repeats: int = 3, device: str = "cpu") -> float:
    """The stacked ideal of ``blocks`` (each stack for its longest client's steps, full batches), fastest of ``repeats``."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(4096, d, generator=gen).to(device), torch.randint(0, 10, (4096,), generator=gen).to(device)

    def one() -> float:
        t0 = time.perf_counter()
        for block in blocks:
            m = len(block)
            params = [torch.randn(m, d, hidden, device=device) * d**-0.5, torch.zeros(m, 1, hidden, device=device),
                      torch.randn(m, hidden, 10, device=device) * hidden**-0.5, torch.zeros(m, 1, 10, device=device)]
            for s in range(max(steps[i] for i in block)):
                rows = torch.arange(m * batch, device=device).view(m, batch) * 7 + s * 13
                xb, yb = x[rows % 4096], y[rows % 4096]
                leaves = [p.requires_grad_(True) for p in params]
                h = torch.relu(torch.baddbmm(leaves[1], xb, leaves[0]))
                logits = torch.baddbmm(leaves[3], h, leaves[2])
                loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 10), yb.reshape(-1))
                grads = torch.autograd.grad(loss * m, leaves)
                with torch.no_grad():
                    params = [p.detach().sub_(g, alpha=0.01) for p, g in zip(leaves, grads, strict=True)]
        _sync(device)
        return time.perf_counter() - t0

    one()
    return min(one() for _ in range(repeats))


def gemm_limit_seconds(samples: int, d: int, hidden: int, repeats: int = 5, device: str = "cpu") -> float:
    """The round's FLOPs (forward + backward: 6 per multiply-add, real rows only) at this machine's GEMM rate."""
    a, w = torch.randn(8192, d, device=device), torch.randn(d, hidden, device=device)
    a @ w
    best = min(_timed(lambda: a @ w, device) for _ in range(repeats))
    rate = 2.0 * 8192 * d * hidden / best
    return 6.0 * samples * (d * hidden + hidden * 10) / rate


def _timed(fn, device: str = "cpu") -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--algorithms", nargs="+", default=["fedavg", "ditto"])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    fed = federation()
    sizes = [len(t) for t in fed.train]
    schedule = LocalSchedule(batch_size=10)
    steps = [schedule.n_steps(s) for s in sizes]
    out: dict = {"clients": len(sizes), "samples_min": min(sizes), "samples_max": max(sizes),
                 "threads": args.threads, "rounds": args.rounds, "device": args.device,
                 "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None}
    for algorithm in args.algorithms:
        rows = {}
        ref = None
        for name, executor in (("sequential", SequentialExecutor()),
                               ("vectorised_one_stack", VectorisedExecutor(group_by_steps=False)),
                               ("vectorised", VectorisedExecutor())):
            seconds, params, model = run(fed, executor, args.rounds, algorithm, args.device)
            if ref is None:
                ref = params
            cap = memory_chunk(model, 10, 128.0)
            if name == "sequential":
                blocks = [[i] for i in range(len(steps))]
            elif name == "vectorised_one_stack":
                blocks = [list(range(i, min(i + cap, len(steps)))) for i in range(0, len(steps), cap)]
            else:
                blocks = stack_blocks(steps, cap, step_overhead(model, 10, args.device))
            rows[name] = {"seconds_per_round": round(seconds, 3), "occupancy": round(stack_occupancy(steps, blocks), 3),
                          "stacks": len(blocks),
                          "max_abs_diff_vs_sequential": float(max((params[k] - ref[k]).abs().max() for k in ref))}
        if args.device == "cuda":  # the grouped stacks with every step launched eagerly (train.capture = off)
            rows["vectorised"]["eager_seconds_per_round"] = round(
                run(fed, VectorisedExecutor(), args.rounds, algorithm, args.device, capture="off")[0], 3)
        seq = rows["sequential"]["seconds_per_round"]
        for row in rows.values():
            row["speedup_vs_sequential"] = round(seq / row["seconds_per_round"], 2)
        if algorithm == "fedavg":  # the floors of a FedAvg round (one pass of every client's steps)
            grouped = stack_blocks(steps, memory_chunk(model, 10, 128.0), step_overhead(model, 10, args.device))
            ideal = ideal_seconds(grouped, steps, fed.input_shape[0], 200, device=args.device)
            limit = gemm_limit_seconds(sum(min(s, 10 * n) for s, n in zip(sizes, steps, strict=True)),
                                       fed.input_shape[0], 200, device=args.device)
            rows["stacked_ideal"] = {"seconds_per_round": round(ideal, 3)}
            rows["gemm_limit"] = {"seconds_per_round": round(limit, 3)}
            for name in ("sequential", "vectorised"):
                rows[name]["over_stacked_ideal"] = round(rows[name]["seconds_per_round"] / ideal, 2)
                rows[name]["over_gemm_limit"] = round(rows[name]["seconds_per_round"] / limit, 2)
        out[algorithm] = rows
    if args.json:
        print(json.dumps(out))
    else:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
