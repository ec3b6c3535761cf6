"""Vectorised vs sequential executor, measured in one run on the same machine.

Cases (from the engine issue):
  1. compute-bound: 100 clients × 600 samples × 784-d, MLP 784-200-200-10,
     E = 1, B = 50, all 100 clients per round (≈ 72 GFLOP per round);
  2. overhead-bound (the CGAU setting): 10 clients × ~150 samples × 64-d,
     MLP 64-64-64-10, 10 local steps of batch 32;
  3. ``fsnet_protocol`` (not run unless named in ``--cases``): Fed-FSNet's MNIST protocol with f = 1 on
     synthetic data of its shape, 100 clients × 480 samples × 784-d, MLP 784-200-200-10, E = 10, B = 60.

Prints seconds per round of each executor and the ratio (sequential / vectorised);
``--json`` prints one JSON object instead. Not a test: timings are never asserted.

Each case also times the **stacked ideal** in the same run: the same clients' local
epochs as nothing but a batched-matmul forward + backward and an SGD update over
the stack (pre-made parameters and batch order, no sampling, seeding, screening or
aggregation), so ``vectorised / ideal`` is what hetfed's round costs above the work
it cannot avoid (issue #26 §2 asks for ≤ 1.2×). Its weights-moved form (``ideal_moved_s_per_round``) moves each
weight by one ``baddbmm_`` from its layer's input and output gradient instead of writing a weight gradient and
reading it back, as hetfed's plain SGD steps do for large weight stacks; its written-out form
(``ideal_written_out_s_per_round``) has no autograd at all (the backward as tensor operations, each weight moved), as
hetfed's plain steps of an MLP do (:mod:`hetfed.models.closed_form`). ``--compare-moves`` and ``--compare-autograd``
time the vectorised round again with no weight moved, or with autograd's backward for every model, in turn with
the others.

On CUDA the vectorised executor is timed with ``train.capture`` auto (steps replayed from CUDA graphs) and off
(eager), and the stacked ideal is also timed **captured**: one step recorded as a CUDA graph and replayed
(``captured_ideal_s_per_round``), the floor a captured step loop (#47 §4) could reach. On a CPU, ``--compile``
also times it with ``train.capture`` compile (steps compiled by ``torch.compile``; the compiling is in the
warm-up rounds, not in the time per round).

    python benchmarks/engine.py [--json] [--rounds N] [--threads T] [--chunks 10 25] [--device cpu|cuda] [--compile]
    [--repeats R]
                                [--compare-moves] [--compare-autograd] [--momentum 0.9]
                                [--cases compute_bound overhead_bound fsnet_protocol]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from hetfed.algorithms import build_algorithm
from hetfed.config import ModelConfig, OptimizerConfig, PartitionConfig, TrainConfig
from hetfed.engine.host_memory import keep_freed_memory
from hetfed.executors.inprocess import SequentialExecutor, VectorisedExecutor
from hetfed.executors.simulate import simulate
from hetfed.models import build_model
from hetfed.models.closed_form import relu_backward_
from hetfed.models.softmax import padded
from hetfed.partition import make_federation


class _Synthetic:
    def __init__(self, n: int, d: int, classes: int = 10, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.y_train = rng.integers(0, classes, n)
        self.x_train = rng.normal(size=(n, d)).astype(np.float32)
        self.y_test = np.repeat(np.arange(classes), 10)
        self.x_test = rng.normal(size=(len(self.y_test), d)).astype(np.float32)
        self.n_classes = classes
        self.input_shape = (d,)


CASES = {
    "compute_bound": dict(
        clients=100, per_client=600, d=784, hidden=[200, 200],
        train=dict(local_epochs=1, batch_size=50),
    ),
    "overhead_bound": dict(
        clients=10, per_client=150, d=64, hidden=[64, 64],
        train=dict(local_steps=10, batch_size=32),
    ),
    "fsnet_protocol": dict(
        clients=100, per_client=480, d=784, hidden=[200, 200],
        train=dict(local_epochs=10, batch_size=60),
    ),
}


def flops_per_round(case: dict) -> float:
    """2 FLOPs per multiply-add, ×3 for forward + backward."""
    widths = [case["d"], *case["hidden"], 10]
    macs = sum(a * b for a, b in zip(widths[:-1], widths[1:], strict=False))
    t = case["train"]
    samples = case["clients"] * (case["per_client"] * t["local_epochs"] if "local_epochs" in t
                                 else t["local_steps"] * t["batch_size"])
    return 6.0 * macs * samples


def seconds_per_round(case: dict, executor, rounds: int, device: str = "cpu", capture: str = "auto") -> float:
    n = case["clients"] * case["per_client"]
    # all samples train: no validation/test split taken out of the clients
    fed = make_federation(
        _Synthetic(n, case["d"]),
        PartitionConfig(kind="iid", clients=case["clients"], val_fraction=0.0, test_fraction=0.0),
        seed=0,
    )
    model = build_model(ModelConfig(kind="mlp", hidden=case["hidden"]), fed.input_shape, fed.n_classes)
    train = TrainConfig(
        rounds=rounds, client_fraction=1.0, eval_every=10_000,
        optimizer=OptimizerConfig(lr=0.01, momentum=case.get("momentum", 0.0)), device=device, capture=capture,
        **case["train"],
    )
    algo = build_algorithm("fedavg", model, train)
    # warm-up; a compiled step (train.capture compile) compiles a key once it has come up in enough rounds' plans
    warm = 12 if capture == "compile" else 1
    simulate(algo, fed, train.model_copy(update={"rounds": warm}), 0, executor=executor)
    t0 = time.perf_counter()
    result = simulate(algo, fed, train, 0, executor=executor)
    total = time.perf_counter() - t0
    # the one final evaluation is not training: report the training time per round
    return result.train_seconds / rounds if result.train_seconds else total / rounds


@contextmanager
def step_without(moves: bool = False, closed_form: bool = False) -> Iterator[None]:
    """hetfed's plain steps with a part of their update path turned off, to time what it buys: ``moves``, every
    weight updated by the optimiser from its gradient (none moved in the backward); ``closed_form``, autograd's
    backward for every model (the steps before :mod:`hetfed.models.closed_form`)."""
    from hetfed.models import closed_form as written_out
    from hetfed.models import sgd_in_backward
    from hetfed.models.base import Model

    kept = sgd_in_backward.MOVE_FROM, written_out.MOVE_FROM
    overridden = {cls: vars(cls)["closed_form"] for cls in _subclasses(Model) if "closed_form" in vars(cls)} \
        if closed_form else {}
    if moves:
        sgd_in_backward.MOVE_FROM = written_out.MOVE_FROM = 1 << 62
    for cls in overridden:
        cls.closed_form = Model.closed_form  # type: ignore[method-assign]
    try:
        yield
    finally:
        sgd_in_backward.MOVE_FROM, written_out.MOVE_FROM = kept
        for cls, own in overridden.items():
            cls.closed_form = own  # type: ignore[method-assign]


def _subclasses(cls: type) -> list[type]:
    return [c for sub in cls.__subclasses__() for c in (sub, *_subclasses(sub))]


def variant_seconds_per_round(case: dict, rounds: int, device: str, moves: bool = False,
                              closed_form: bool = False) -> float:
    """:func:`seconds_per_round` of the vectorised executor under :func:`step_without`."""
    with step_without(moves=moves, closed_form=closed_form):
        return seconds_per_round(case, VectorisedExecutor(), rounds, device)


def cpu_name() -> str | None:
    """The host CPU's model (Linux's ``/proc/cpuinfo``), recorded with every timing: sessions run on separate
    machines, whose speeds differ."""
    try:
        with open("/proc/cpuinfo") as fh:
            return next((line.split(":", 1)[1].strip() for line in fh if line.startswith("model name")), None)
    except OSError:
        return None


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@torch.no_grad()
def gather(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``x[rows]`` by ``index_select`` (on a CPU torch's advanced indexing by a 2-D index is several times slower for
    the same values): the ideal gathers its batches the fastest way, as hetfed's step does
    (:func:`hetfed.engine.types.take_rows`)."""
    return x.index_select(0, rows.reshape(-1)).view(*rows.shape, *x.shape[1:])


def written_out_step(params: list[torch.Tensor], xb: torch.Tensor, yb: torch.Tensor, lr: float) -> None:
    """One SGD step of stacked ReLU MLPs (``params``: weight ``[n, in, out]``, bias ``[n, 1, out]``, … updated in
    place) on a batch ``xb`` ``[n, B, in]`` with labels ``yb`` ``[n, B]``, with no autograd: the backward as tensor
    operations (∂(Σ_clients mean cross-entropy)/∂logits = (softmax − onehot) / B — the softmax over padded rows on a
    CPU, as hetfed's step takes it —, each layer's input gradient, the ReLU's backward as hetfed's MLP takes it) and
    each weight moved by one ``baddbmm_`` — the bare form of :mod:`hetfed.models.closed_form`."""
    h, inputs = xb, []
    for i in range(0, len(params), 2):
        inputs.append(h)
        h = torch.baddbmm(params[i + 1], h, params[i])
        h = h.relu_() if i + 2 < len(params) else h
    wide = padded(h)  # few classes on a CPU: padded, as hetfed's step does
    g = torch.softmax(h, -1) if wide is None else torch.softmax(wide, -1)[..., : h.shape[-1]]
    g.scatter_add_(-1, yb.unsqueeze(-1), torch.full_like(g[..., :1], -1.0)).div_(yb.shape[1])
    for i in range(len(params) - 2, -1, -2):
        g_in = torch.bmm(g, params[i].transpose(1, 2)) if i else None
        params[i].baddbmm_(inputs[i // 2].transpose(1, 2), g, alpha=-lr)
        params[i + 1].sub_(g.sum(1, keepdim=True), alpha=lr)
        if g_in is not None:
            g = relu_backward_(g_in, inputs[i // 2])


def ideal_seconds_per_round(case: dict, repeats: int = 3, device: str = "cpu", captured: bool = False,
                            form: str = "autograd") -> float:
    """The stacked ideal of ``case`` (the fastest of ``repeats``), on synthetic data of the same shapes.

    ``captured`` (CUDA only): one step is recorded as a CUDA graph once and replayed for every step, its
    batch rows copied into the graph's static index first: what the step costs without launching kernels
    one by one from Python. ``form``: ``autograd`` (the forward, autograd's backward, an SGD update); ``moved``:
    autograd computes the gradients of the layers' outputs only, and each weight is moved by one ``baddbmm_`` from
    its layer's input and output gradient (no weight gradient written and read back: what hetfed's plain SGD steps
    do through autograd, :mod:`hetfed.models.sgd_in_backward`); ``written_out``: no autograd, the backward as
    tensor operations and each weight moved (what hetfed's plain steps of an MLP do,
    :mod:`hetfed.models.closed_form`)."""
    torch.manual_seed(0)
    n, m, widths = case["clients"], case["per_client"], [case["d"], *case["hidden"], 10]
    t = case["train"]
    batch = t["batch_size"]
    steps = -(-m // batch) * t["local_epochs"] if "local_epochs" in t else t["local_steps"]
    x = torch.randn(n * m, case["d"], device=device)
    y = torch.randint(0, 10, (n * m,), device=device)
    order = torch.stack([torch.randperm(m) + k * m for k in range(n)]).repeat(1, -(-steps * batch // m) + 1).to(device)

    def fresh() -> list[torch.Tensor]:
        params = []
        for a, b in zip(widths[:-1], widths[1:], strict=False):
            params += [torch.randn(n, a, b, device=device) * a**-0.5, torch.zeros(n, 1, b, device=device)]
        return params

    def step(params: list[torch.Tensor], rows: torch.Tensor) -> list[torch.Tensor]:
        h, yb = gather(x, rows), gather(y, rows)
        leaves = [p.requires_grad_(True) for p in params]
        for i in range(0, len(leaves), 2):
            h = torch.baddbmm(leaves[i + 1], h, leaves[i])
            if i + 2 < len(leaves):
                h = torch.relu(h)
        loss = torch.nn.functional.cross_entropy(h.reshape(-1, 10), yb.reshape(-1), reduction="none")
        grads = torch.autograd.grad(loss.view(n, -1).mean(1).sum(), leaves)
        with torch.no_grad():
            return [p.detach().sub_(g, alpha=0.01) for p, g in zip(leaves, grads, strict=True)]

    def step_moved(params: list[torch.Tensor], rows: torch.Tensor) -> list[torch.Tensor]:
        h, yb = gather(x, rows), gather(y, rows)
        biases = [b.requires_grad_(True) for b in params[1::2]]
        inputs, outputs = [], []
        for i, (w, b) in enumerate(zip(params[0::2], biases, strict=True)):
            inputs.append(h)
            outputs.append(torch.baddbmm(b, h, w))
            h = torch.relu(outputs[-1]) if i + 1 < len(biases) else outputs[-1]
        loss = torch.nn.functional.cross_entropy(h.reshape(-1, 10), yb.reshape(-1), reduction="none")
        grads = torch.autograd.grad(loss.view(n, -1).mean(1).sum(), outputs)
        with torch.no_grad():
            for w, b, hin, g in zip(params[0::2], biases, inputs, grads, strict=True):
                w.baddbmm_(hin.transpose(1, 2), g, alpha=-0.01)
                b.detach().sub_(g.sum(1, keepdim=True), alpha=0.01)
        return [t.detach() for pair in zip(params[0::2], biases, strict=True) for t in pair]

    def step_written_out(params: list[torch.Tensor], rows: torch.Tensor) -> list[torch.Tensor]:
        written_out_step(params, gather(x, rows), gather(y, rows), 0.01)
        return params

    if form == "moved":
        step = step_moved  # noqa: F811  (the ideal's other forms)
    elif form == "written_out":
        step = step_written_out  # noqa: F811

    def one_round() -> float:
        params = fresh()
        _sync(device)
        t0 = time.perf_counter()
        for s in range(steps):
            params = step(params, order[:, s * batch:(s + 1) * batch])
        _sync(device)
        return time.perf_counter() - t0

    def one_captured_round() -> float:
        params = [p.requires_grad_(True) for p in fresh()]
        rows = order[:, :batch].clone()
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):  # warm-up on a side stream, as torch.cuda.graphs asks
                step(params, rows)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(params, rows)
        _sync(device)
        t0 = time.perf_counter()
        for s in range(steps):
            rows.copy_(order[:, s * batch:(s + 1) * batch])
            graph.replay()
        _sync(device)
        return time.perf_counter() - t0

    timed = one_captured_round if captured else one_round
    timed()  # warm-up
    return min(timed() for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--chunks", type=int, nargs="*", default=[], help="also time the vectorised executor with "
                                                                          "these chunk sizes")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeats", type=int, default=1,
                        help="time the vectorised round and its ideal (and --compile's) this many times in turn; "
                             "medians")
    parser.add_argument("--compile", action="store_true",
                        help="on a CPU, also time the vectorised executor with train.capture compile (torch.compile)")
    parser.add_argument("--compare-moves", action="store_true",
                        help="also time the vectorised round with every weight updated by the optimiser (no weight "
                             "moved in the backward: hetfed.models.sgd_in_backward), in turn with the others")
    parser.add_argument("--compare-autograd", action="store_true",
                        help="also time the vectorised round with autograd's backward for every model (no step "
                             "written out: hetfed.models.closed_form), in turn with the others")
    parser.add_argument("--momentum", type=float, default=0.0,
                        help="hetfed's executors train with this SGD momentum (the stacked ideals stay plain SGD)")
    parser.add_argument("--cases", nargs="+", default=["compute_bound", "overhead_bound"], choices=list(CASES))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    # as in a hetfed run (the round and its ideal alike): freed memory kept for the next round (HETFED_MALLOC=off: not)
    kept = keep_freed_memory()
    report = {"torch": torch.__version__, "threads": torch.get_num_threads(), "device": args.device,
              "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None, "cpu": cpu_name(),
              "cpus": os.cpu_count(), "momentum": args.momentum, "malloc_kept": kept, "cases": {}}
    for name in args.cases:
        case = {**CASES[name], "momentum": args.momentum}
        seq = seconds_per_round(case, SequentialExecutor(), args.rounds, args.device)
        # the vectorised round and its ideal (and the compiled round) timed in turn, --repeats times, medians: on a
        # shared machine the speed drifts by tens of percent within minutes, which a ratio of two far-apart
        # timings would take for the framework's
        compiling = args.compile and args.device == "cpu"
        timed: dict[str, list[float]] = {"vec": [], "ideal": [], "ideal_moved": [], "ideal_written_out": [],
                                         "compiled": [], "unmoved": [], "autograd": []}
        for _ in range(args.repeats):
            timed["vec"].append(seconds_per_round(case, VectorisedExecutor(), args.rounds, args.device))
            if args.compare_moves:
                timed["unmoved"].append(variant_seconds_per_round(case, args.rounds, args.device, moves=True))
            if args.compare_autograd:
                timed["autograd"].append(variant_seconds_per_round(case, args.rounds, args.device, closed_form=True))
            timed["ideal"].append(ideal_seconds_per_round(case, device=args.device))
            timed["ideal_moved"].append(ideal_seconds_per_round(case, device=args.device, form="moved"))
            timed["ideal_written_out"].append(ideal_seconds_per_round(case, device=args.device, form="written_out"))
            if compiling:
                timed["compiled"].append(seconds_per_round(case, VectorisedExecutor(), args.rounds, args.device,
                                                           capture="compile"))
        vec, ideal = float(np.median(timed["vec"])), float(np.median(timed["ideal"]))
        moved = float(np.median(timed["ideal_moved"]))
        written = float(np.median(timed["ideal_written_out"]))
        report["cases"][name] = {
            "ideal_s_per_round": ideal,
            "vectorised_over_ideal": vec / ideal,
            "ideal_moved_s_per_round": moved,
            "vectorised_over_ideal_moved": vec / moved,
            "ideal_written_out_s_per_round": written,
            "vectorised_over_ideal_written_out": vec / written,
            "sequential_s_per_round": seq,
            "vectorised_s_per_round": vec,
            "ratio": seq / vec,
            "gflop_per_round": flops_per_round(case) / 1e9,
            "vectorised_gflops": flops_per_round(case) / 1e9 / vec,
        }
        if args.compare_moves:
            unmoved = float(np.median(timed["unmoved"]))
            report["cases"][name]["vectorised_unmoved_s_per_round"] = unmoved
            report["cases"][name]["unmoved_over_moved"] = unmoved / vec
        if args.compare_autograd:
            by_autograd = float(np.median(timed["autograd"]))
            report["cases"][name]["vectorised_autograd_s_per_round"] = by_autograd
            report["cases"][name]["autograd_over_written_out"] = by_autograd / vec
        if args.device == "cuda":  # the same executor with every step launched eagerly (train.capture = off)
            eager = seconds_per_round(case, VectorisedExecutor(), args.rounds, args.device, capture="off")
            report["cases"][name]["vectorised_eager_s_per_round"] = eager
            report["cases"][name]["eager_over_captured"] = eager / vec
            captured = ideal_seconds_per_round(case, device="cuda", captured=True)
            report["cases"][name]["captured_ideal_s_per_round"] = captured
            report["cases"][name]["vectorised_over_captured_ideal"] = vec / captured
        if compiling:  # the same executor with its steps compiled (train.capture)
            compiled = float(np.median(timed["compiled"]))
            report["cases"][name]["vectorised_compiled_s_per_round"] = compiled
            report["cases"][name]["compiled_over_ideal"] = compiled / ideal
            report["cases"][name]["eager_over_compiled"] = vec / compiled
        for size in args.chunks:
            t = seconds_per_round(case, VectorisedExecutor(chunk_clients=size), args.rounds, args.device)
            report["cases"][name][f"vectorised_chunk{size}_s_per_round"] = t
            report["cases"][name][f"ratio_chunk{size}"] = seq / t
    if args.json:
        print(json.dumps(report))
        return
    print(f"torch {report['torch']}, {report['threads']} threads")
    for name, r in report["cases"].items():
        print(
            f"{name:>15}: sequential {r['sequential_s_per_round']:.4f} s/round, "
            f"vectorised {r['vectorised_s_per_round']:.4f} s/round, ratio {r['ratio']:.2f}×, "
            f"stacked ideal {r['ideal_s_per_round']:.4f} s/round (vectorised {r['vectorised_over_ideal']:.2f}× it; "
            f"{r['vectorised_over_ideal_moved']:.2f}× its weights-moved form, {r['ideal_moved_s_per_round']:.4f}; "
            f"{r['vectorised_over_ideal_written_out']:.2f}× its written-out form, "
            f"{r['ideal_written_out_s_per_round']:.4f}) "
            f"({r['gflop_per_round']:.1f} GFLOP/round, {r['vectorised_gflops']:.1f} GFLOP/s vectorised)"
        )
        for key, value in r.items():
            if key.startswith("ratio_chunk"):
                print(f"{'':>17}chunk of {key[len('ratio_chunk'):]} clients: ratio {value:.2f}×")


if __name__ == "__main__":
    main()
