"""Unequal clients (#47 §1: only active clients compute), measured in one run on the same machine.

The field's most common setting: 20 clients of a Dirichlet α = 0.1 split (62 … thousands of samples), an MLP
784-200-10, E = 1, B = 10, every client every round, FedAvg — here on synthetic data of Fashion-MNIST's shape
(24 000 × 784, 10 classes), so it runs offline. ``--model cnn4``: PFLlib's leaderboard model on the same split
(28 × 28 images; ``--samples`` shrinks the pool for a CPU). Three executors on the same federation:

- ``sequential``: one client at a time (no padding, no stacking);
- ``vectorised_one_stack``: the round's clients in one stack, in id order (``group_by_steps`` off; with a
  method of plain steps, FedAvg and Ditto, the step still computes only the clients that train, reordering the
  stack longest first itself; other methods compute the finished clients masked until the longest is done);
- ``vectorised``: the executor's stacks (:meth:`hetfed.executors.inprocess.InProcessExecutor.blocks`: longest
  first for plain steps, else grouped by plan length by :func:`hetfed.engine.stacks.stack_blocks`).

``--compile`` (CPU) adds the sequential and vectorised executors with ``train.capture: compile`` (their steps
compiled by ``torch.compile``; the compiling is in the warm-up rounds). For each: seconds per round (training only),
the stack occupancy (real client-steps ÷ computed client-steps, counted step by step over every stacked step of the
timed rounds, extra passes included, as each step computed them)
and the largest parameter difference from the sequential run (the executors agree to float tolerance).
Two floors, timed in the same run: the **stacked ideal** (the vectorised executor's stacks as nothing but a
batched-matmul forward, autograd backward and SGD update per step, over the clients still training where the
executor's step computes only those: pre-made parameters and batch order, no sampling, planning, masking or
aggregation; for the MLP also in its weights-moved form, each weight moved by one ``baddbmm_`` from its layer's
input and output gradient, as hetfed's plain SGD steps do for large weight stacks, and in its written-out form,
no autograd at all, as hetfed's plain steps of an MLP do) and the **GEMM limit** (the
round's FLOPs on real rows at the rate
this machine reaches on one large matmul of the same inner dimensions; for ``cnn4``, on one large batch through
its second convolution, where most of its FLOPs are).
Ratios are from one run; timings are never asserted.

    python benchmarks/unequal.py [--rounds 2] [--threads 2] [--device cpu|cuda] [--json]
                                 [--model mlp|cnn4] [--samples 24000] [--executors sequential vectorised …] [--compile]
"""

from __future__ import annotations

import argparse
import json
import time

import conv_forms  # benchmarks/conv_forms.py: the CNN's forms over a stack of clients (this folder is on sys.path)
import torch
import torch.nn.functional as F
from engine import (  # benchmarks/engine.py (this folder is on sys.path)
    _Synthetic,  # random inputs of a given shape
    cpu_name,
    written_out_step,
)

from hetfed.algorithms import build_algorithm
from hetfed.config import ModelConfig, OptimizerConfig, PartitionConfig, TrainConfig
from hetfed.engine import local
from hetfed.engine.local import LocalSchedule
from hetfed.engine.stacks import stack_blocks
from hetfed.executors.inprocess import (
    SequentialExecutor,
    VectorisedExecutor,
    step_overhead,
)
from hetfed.executors.simulate import simulate
from hetfed.models import build_model
from hetfed.partition import make_federation


def federation(n: int = 24_000, d: int = 784, clients: int = 20, alpha: float = 0.1, images: bool = False):
    """The Dirichlet split of ``n`` synthetic samples; ``images``: 28 × 28 (``d`` = 784) for the CNN."""
    cfg = PartitionConfig(kind="dirichlet", clients=clients, alpha=alpha, val_fraction=0.0, test_fraction=0.0)
    data = _Synthetic(n, d)
    if images:
        data.input_shape = (28, 28)
    return make_federation(data, cfg, seed=0)


MODELS = {"mlp": ModelConfig(kind="mlp", hidden=[200]), "cnn4": ModelConfig(kind="cnn4")}


#: the executors timed, by name: one client at a time; one stack in id order (hetfed 0.1); stacks of similar plans
EXECUTORS = {"sequential": SequentialExecutor,
             "vectorised_one_stack": lambda: VectorisedExecutor(group_by_steps=False),
             "vectorised": VectorisedExecutor}


def run(fed, executor, rounds: int, algorithm: str = "fedavg", device: str = "cpu", capture: str = "auto",
        model_kind: str = "mlp"):
    """(seconds a training round, the server's parameters, the model, the occupancy the timed rounds' stacked steps
    had: real client-steps ÷ the client-steps they computed, counted step by step as each computed them — a method
    whose steps compute only the clients still training counts so whether or not it declares it)."""
    model = build_model(MODELS[model_kind], fed.input_shape, fed.n_classes)
    train = TrainConfig(rounds=rounds, client_fraction=1.0, eval_every=10_000, local_epochs=1, batch_size=10,
                        optimizer=OptimizerConfig(lr=0.01, momentum=0.0), device=device, capture=capture)
    algo = build_algorithm(algorithm, model, train)
    # warm-up (train.capture compile: its shapes are compiled there, once they have come up often enough)
    warm = 4 if capture == "compile" else 1
    simulate(algo, fed, train.model_copy(update={"rounds": warm}), 0, executor=executor)
    counted = [0, 0]  # real client-steps, computed client-steps
    keys = local._step_keys

    def counting(plan, reads_rows, compacts, recorded):
        out = keys(plan, reads_rows, compacts, recorded)
        counted[0] += sum(len(rows) - rows.count(0) for w, rows in zip(plan.widths, plan.rows, strict=True) if w)
        counted[1] += sum(key[3] for key in out)
        return out

    local._step_keys = counting
    try:
        t0 = time.perf_counter()
        result = simulate(algo, fed, train, 0, executor=executor)
    finally:
        local._step_keys = keys
    per_round = result.train_seconds / rounds if result.train_seconds else (time.perf_counter() - t0) / rounds
    return per_round, result.server.params, model, counted[0] / counted[1] if counted[1] else 1.0


def _timed_stacks(blocks: list[list[int]], steps: list[int], n_rows: int, fresh, step, batch: int, repeats: int,
                  device: str, plain: bool) -> float:
    """Each stack of ``blocks`` for its longest client's steps: ``step(whole, m, rows)`` over ``fresh(len(block))``
    stacked parameters, its first ``m`` clients (``plain``: those still training, the first ones of a longest-first
    stack; else all) on full batches of pre-made rows; the fastest of ``repeats``."""

    def one() -> float:
        t0 = time.perf_counter()
        for block in blocks:
            whole = fresh(len(block))
            for s in range(max(steps[i] for i in block)):
                m = sum(1 for i in block if steps[i] > s) if plain else len(block)
                step(whole, m, (torch.arange(m * batch, device=device).view(m, batch) * 7 + s * 13) % n_rows)
        _sync(device)
        return time.perf_counter() - t0

    one()
    return min(one() for _ in range(repeats))


def _stacked_ideal(blocks: list[list[int]], steps: list[int], x: torch.Tensor, y: torch.Tensor,
                   fresh, forward, lr: float, batch: int, repeats: int, device: str, plain: bool = False) -> float:
    """:func:`_timed_stacks` of ``forward`` over the stacked parameters, autograd backward and an SGD update."""

    def step(whole: list[torch.Tensor], m: int, rows: torch.Tensor) -> None:
        leaves = [p[:m].requires_grad_(True) for p in whole]
        logits = forward(leaves, x[rows])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[rows].reshape(-1))
        grads = torch.autograd.grad(loss * m, leaves)
        with torch.no_grad():
            for p, g in zip(leaves, grads, strict=True):
                p.detach().sub_(g, alpha=lr)

    return _timed_stacks(blocks, steps, len(x), fresh, step, batch, repeats, device, plain)


def _moved_ideal(blocks: list[list[int]], steps: list[int], x: torch.Tensor, y: torch.Tensor, fresh, lr: float,
                 batch: int, repeats: int, device: str, plain: bool) -> float:
    """:func:`_stacked_ideal` of an MLP (``fresh``: weight, bias, weight, bias, … stacks) in its weights-moved form:
    autograd computes the gradients of the layers' outputs only, and each weight is moved by one ``baddbmm_`` from
    its layer's input and output gradient (no weight gradient written and read back)."""

    def step(whole: list[torch.Tensor], m: int, rows: torch.Tensor) -> None:
        h, inputs, outputs = x[rows], [], []
        biases = [b[:m].requires_grad_(True) for b in whole[1::2]]
        for i, (w, b) in enumerate(zip(whole[0::2], biases, strict=True)):
            inputs.append(h)
            outputs.append(torch.baddbmm(b, h, w[:m]))
            h = torch.relu(outputs[-1]) if i + 1 < len(biases) else outputs[-1]
        loss = F.cross_entropy(h.reshape(-1, h.shape[-1]), y[rows].reshape(-1))
        grads = torch.autograd.grad(loss * m, outputs)
        with torch.no_grad():
            for w, b, hin, g in zip(whole[0::2], biases, inputs, grads, strict=True):
                w[:m].baddbmm_(hin.transpose(1, 2), g, alpha=-lr)
                b.detach().sub_(g.sum(1, keepdim=True), alpha=lr)

    return _timed_stacks(blocks, steps, len(x), fresh, step, batch, repeats, device, plain)


def _written_out_ideal(blocks: list[list[int]], steps: list[int], x: torch.Tensor, y: torch.Tensor, fresh, lr: float,
                       batch: int, repeats: int, device: str, plain: bool) -> float:
    """:func:`_stacked_ideal` of an MLP with no autograd: the backward as tensor operations (the cross-entropy's
    ``softmax − onehot``, each layer's input gradient, the ReLU's mask) and each weight moved by one ``baddbmm_``."""

    def step(whole: list[torch.Tensor], m: int, rows: torch.Tensor) -> None:
        written_out_step([p[:m] for p in whole], x[rows], y[rows], lr)

    return _timed_stacks(blocks, steps, len(x), fresh, step, batch, repeats, device, plain)


def ideal_seconds(blocks: list[list[int]], steps: list[int], d: int, hidden: int, batch: int = 10,
                  repeats: int = 3, device: str = "cpu", plain: bool = False, form: str = "autograd") -> float:
    """The stacked ideal of the MLP d-hidden-10 over ``blocks``: batched matmuls (``form``: ``autograd``, its
    weights-moved form ``moved``, :func:`_moved_ideal`, or ``written_out``, :func:`_written_out_ideal`)."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(4096, d, generator=gen).to(device), torch.randint(0, 10, (4096,), generator=gen).to(device)

    def fresh(m: int) -> list[torch.Tensor]:
        return [torch.randn(m, d, hidden, device=device) * d**-0.5, torch.zeros(m, 1, hidden, device=device),
                torch.randn(m, hidden, 10, device=device) * hidden**-0.5, torch.zeros(m, 1, 10, device=device)]

    def forward(leaves: list[torch.Tensor], xb: torch.Tensor) -> torch.Tensor:
        return torch.baddbmm(leaves[3], torch.relu(torch.baddbmm(leaves[1], xb, leaves[0])), leaves[2])

    if form != "autograd":
        ideal = _moved_ideal if form == "moved" else _written_out_ideal
        return ideal(blocks, steps, x, y, fresh, 0.01, batch, repeats, device, plain)
    return _stacked_ideal(blocks, steps, x, y, fresh, forward, 0.01, batch, repeats, device, plain)


def cnn4_ideal_seconds(blocks: list[list[int]], steps: list[int], batch: int = 10, repeats: int = 2,
                       device: str = "cpu", plain: bool = False) -> float:
    """The stacked ideal of the CNN round over ``blocks``, each stack's forward in the form each device runs
    fastest (grouped convolutions through ``torch.func.vmap`` on CUDA, a loop of plain convolutions on a CPU, as
    hetfed's model chooses)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 1, 28, 28, generator=gen).to(device)
    y = torch.randint(0, 10, (4096,), generator=gen).to(device)

    def fresh(m: int) -> list[torch.Tensor]:
        return [torch.randn(m, *shape, device=device) * 0.05 for shape in conv_forms.SHAPES]

    forward = conv_forms.loop if device == "cpu" else conv_forms.FORMS["vmap"]

    return _stacked_ideal(blocks, steps, x, y, fresh, forward, 0.005, batch, repeats, device, plain)


def conv_limit_seconds(samples: int, repeats: int = 5, device: str = "cpu") -> float:
    """The CNN round's FLOPs (forward + backward: 6 per multiply-add, real rows only) at the rate this machine
    reaches on one large batch through the CNN's second convolution (most of its multiply-adds)."""
    a, w = torch.randn(2048, 32, 12, 12, device=device), torch.randn(64, 32, 5, 5, device=device)
    F.conv2d(a, w)
    best = min(_timed(lambda: F.conv2d(a, w), device) for _ in range(repeats))
    rate = 2.0 * 2048 * 8 * 8 * 64 * 32 * 25 / best
    return 6.0 * samples * conv_forms.MACS / rate


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


def _max_diff(params: dict, ref: dict) -> float | None:
    """The largest difference between two runs' server models (None: a method without one, FedProto's)."""
    return float(max((params[k] - ref[k]).abs().max() for k in ref)) if ref else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--algorithms", nargs="+", default=["fedavg", "ditto"])
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--model", default="mlp", choices=list(MODELS))
    ap.add_argument("--samples", type=int, default=24_000, help="the synthetic pool split over the 20 clients")
    ap.add_argument("--executors", nargs="+", default=list(EXECUTORS), choices=list(EXECUTORS))
    ap.add_argument("--compile", action="store_true",
                    help="on a CPU, also time the sequential and vectorised executors with train.capture compile")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    fed = federation(n=args.samples, images=args.model == "cnn4")
    sizes = [len(t) for t in fed.train]
    schedule = LocalSchedule(batch_size=10)
    steps = [schedule.n_steps(s) for s in sizes]
    out: dict = {"model": args.model, "clients": len(sizes), "samples": args.samples, "samples_min": min(sizes),
                 "samples_max": max(sizes), "threads": args.threads, "rounds": args.rounds, "device": args.device,
                 "cpu": cpu_name(),
                 "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None}
    for algorithm in args.algorithms:
        rows = {}
        ref = None
        grouped: list[list[int]] = []  # the vectorised executor's stacks
        plain = False  # whether its steps compute only the clients still training
        for name in args.executors:
            executor = EXECUTORS[name]()
            seconds, params, model, occupancy = run(fed, executor, args.rounds, algorithm, args.device,
                                                    model_kind=args.model)
            if ref is None:
                ref = params
            cap = executor.chunk_size(model, 10)
            blocks = [[i] for i in range(len(steps))] if name == "sequential" else executor.blocks(steps, cap)
            plain = executor.plain_steps()
            if name == "vectorised":
                grouped = blocks
            rows[name] = {
                "seconds_per_round": round(seconds, 3),
                "occupancy": round(occupancy, 3),
                "stacks": len(blocks),
                f"max_abs_diff_vs_{args.executors[0]}": _max_diff(params, ref),
            }
        if args.compile and args.device == "cpu":  # the same executors with their steps compiled (train.capture)
            for name in [n for n in ("sequential", "vectorised") if n in args.executors]:
                seconds, params, _, occupancy = run(fed, EXECUTORS[name](), args.rounds, algorithm, args.device,
                                                    capture="compile", model_kind=args.model)
                rows[f"{name}_compiled"] = {"seconds_per_round": round(seconds, 3), "occupancy": round(occupancy, 3),
                                            f"max_abs_diff_vs_{args.executors[0]}": _max_diff(params, ref)}
        if args.device == "cuda" and "vectorised" in rows:  # the grouped stacks, every step launched eagerly
            rows["vectorised"]["eager_seconds_per_round"] = round(
                run(fed, VectorisedExecutor(), args.rounds, algorithm, args.device, capture="off",
                    model_kind=args.model)[0], 3)
        if "sequential" in rows:
            seq = rows["sequential"]["seconds_per_round"]
            for row in rows.values():
                row["speedup_vs_sequential"] = round(seq / row["seconds_per_round"], 2)
        if algorithm == "fedavg":  # the floors of a FedAvg round (one pass of every client's steps)
            grouped = grouped or stack_blocks(steps, cap, step_overhead(model, 10, args.device))
            real = sum(min(s, 10 * n) for s, n in zip(sizes, steps, strict=True))
            if args.model == "cnn4":
                ideal = cnn4_ideal_seconds(grouped, steps, device=args.device, plain=plain)
                limit = conv_limit_seconds(real, device=args.device)
            else:
                ideal = ideal_seconds(grouped, steps, fed.input_shape[0], 200, device=args.device, plain=plain)
                limit = gemm_limit_seconds(real, fed.input_shape[0], 200, device=args.device)
            rows["stacked_ideal"] = {"seconds_per_round": round(ideal, 3)}
            forms = {}
            if args.model != "cnn4":
                for form in ("moved", "written_out"):
                    forms[form] = ideal_seconds(grouped, steps, fed.input_shape[0], 200, device=args.device,
                                                plain=plain, form=form)
                    rows[f"stacked_ideal_{form}"] = {"seconds_per_round": round(forms[form], 3)}
            rows["gemm_limit"] = {"seconds_per_round": round(limit, 3)}
            for name in ("sequential", "vectorised", "sequential_compiled", "vectorised_compiled"):
                if name in rows:
                    rows[name]["over_stacked_ideal"] = round(rows[name]["seconds_per_round"] / ideal, 2)
                    for form, seconds in forms.items():
                        rows[name][f"over_stacked_ideal_{form}"] = round(rows[name]["seconds_per_round"] / seconds, 2)
                    rows[name]["over_gemm_limit"] = round(rows[name]["seconds_per_round"] / limit, 2)
        out[algorithm] = rows
    if args.json:
        print(json.dumps(out))
    else:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
