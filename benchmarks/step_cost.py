"""What one training step of a stack of MLPs costs: hetfed's step against two bare torch loops, in one run.

A step of a small stack is bound by its fixed cost (Python, dispatch, autograd), not its arithmetic; this prints,
for ``--clients`` equal clients of an MLP ``--widths`` at batch ``--batch`` (SGD, no momentum), microseconds per step
of:

- ``hetfed``: the vectorised executor's training rounds (``train_stack``'s time only, divided by its steps);
- ``hetfed_autograd``: the same with autograd's backward for every model (no step written out in closed form);
- ``bare_autograd``: a bare loop of the same step: batched-matmul forward, ``torch.autograd.grad``, SGD update;
- ``bare_written_out``: a bare loop with the backward as tensor operations and each weight moved by ``baddbmm_``
  (what :mod:`hetfed.models.closed_form` does, without hetfed around it).

Timings are never asserted.

    python benchmarks/step_cost.py [--widths 784 200 10] [--clients 1] [--batch 10] [--threads 2] [--steps 100]
"""

from __future__ import annotations

import argparse
import json
import time

import torch
import torch.nn.functional as F
from engine import (  # this folder is on sys.path
    _Synthetic,
    cpu_name,
    step_without,
    written_out_step,
)

from hetfed.algorithms import build_algorithm
from hetfed.config import ModelConfig, OptimizerConfig, PartitionConfig, TrainConfig
from hetfed.engine import local
from hetfed.executors.inprocess import VectorisedExecutor
from hetfed.executors.simulate import simulate
from hetfed.models import build_model
from hetfed.partition import make_federation


def hetfed_us(widths: list[int], n: int, batch: int, steps: int, rounds: int = 5) -> float:
    """Microseconds per step inside ``train_stack`` over ``rounds`` rounds of ``steps`` steps each."""
    fed = make_federation(_Synthetic(n * steps * batch, widths[0]),
                          PartitionConfig(kind="iid", clients=n, val_fraction=0.0, test_fraction=0.0), seed=0)
    model = build_model(ModelConfig(kind="mlp", hidden=widths[1:-1]), fed.input_shape, fed.n_classes)
    train = TrainConfig(rounds=rounds, client_fraction=1.0, eval_every=10_000, local_epochs=1, batch_size=batch,
                        optimizer=OptimizerConfig(lr=0.01, momentum=0.0))
    algo = build_algorithm("fedavg", model, train)
    simulate(algo, fed, train.model_copy(update={"rounds": 1}), 0, executor=VectorisedExecutor())
    inside = [0.0]
    real = local.train_stack

    def timed(*a, **k):
        t0 = time.perf_counter()
        out = real(*a, **k)
        inside[0] += time.perf_counter() - t0
        return out

    import hetfed.algorithms.fedavg as fedavg

    fedavg.train_stack = timed
    try:
        simulate(algo, fed, train, 0, executor=VectorisedExecutor())
    finally:
        fedavg.train_stack = real
    return inside[0] / rounds / steps * 1e6


def bare_us(widths: list[int], n: int, batch: int, written_out: bool, steps: int = 1000) -> float:
    """Microseconds per step of a bare torch loop over ``n`` stacked MLPs (the fastest of three passes)."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(4096, widths[0], generator=gen), torch.randint(0, widths[-1], (4096,), generator=gen)
    params = []
    for a, b in zip(widths[:-1], widths[1:], strict=True):
        params += [torch.randn(n, a, b, generator=gen) * a ** -0.5, torch.zeros(n, 1, b)]

    def autograd_step(s: int) -> None:
        rows = (torch.arange(n * batch).view(n, batch) * 7 + s * 13) % len(x)
        leaves = [p.requires_grad_(True) for p in params]
        h = x[rows]
        for i in range(0, len(leaves), 2):
            h = torch.baddbmm(leaves[i + 1], h, leaves[i])
            h = torch.relu(h) if i + 2 < len(leaves) else h
        loss = F.cross_entropy(h.reshape(-1, widths[-1]), y[rows].reshape(-1))
        grads = torch.autograd.grad(loss * n, leaves)
        with torch.no_grad():
            torch._foreach_add_([p.detach() for p in leaves], list(grads), alpha=-0.01)

    def bare_written_out_step(s: int) -> None:
        rows = (torch.arange(n * batch).view(n, batch) * 7 + s * 13) % len(x)
        written_out_step(params, x[rows], y[rows], 0.01)

    step = bare_written_out_step if written_out else autograd_step
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for s in range(steps):
            step(s)
        best = min(best, time.perf_counter() - t0)
    return best / steps * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--widths", type=int, nargs="+", default=[784, 200, 10])
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=100, help="steps of a hetfed round")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    w, n, b = args.widths, args.clients, args.batch
    with step_without(closed_form=True):
        by_autograd = hetfed_us(w, n, b, args.steps)
    out = {"widths": w, "clients": n, "batch": b, "threads": args.threads, "cpu": cpu_name(),
           "us_per_step": {"hetfed": round(hetfed_us(w, n, b, args.steps), 1),
                           "hetfed_autograd": round(by_autograd, 1),
                           "bare_autograd": round(bare_us(w, n, b, written_out=False), 1),
                           "bare_written_out": round(bare_us(w, n, b, written_out=True), 1)}}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
