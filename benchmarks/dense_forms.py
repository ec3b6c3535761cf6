"""Which form of a stack of clients' dense layers is fastest on this CPU: one SGD-with-momentum step's three batched
products (forward, input gradient, weight update) of ``n`` clients' ``in → out`` layers, batch ``B``, in each form.

- ``in_out`` (hetfed's): weights stored ``[n, in, out]``; forward ``baddbmm(b, x, W)``, input
  gradient ``bmm(g, Wᵀ)``, update ``v.baddbmm_(xᵀ, g, beta=m)`` then ``W −= lr·v``;
- ``out_in``: weights stored ``[n, out, in]`` (``nn.Linear``'s layout); forward ``baddbmm(b, x, Wᵀ)``, input gradient
  ``bmm(g, W)``, update ``v.baddbmm_(gᵀ, x, beta=m)``;
- ``in_out_transposed``: ``in_out``'s storage, each product computed as its transpose (forward ``(Wᵀ xᵀ)ᵀ`` made
  contiguous, update ``gᵀ x`` added transposed): the numbers of ``out_in`` without changing what is stored;
- ``in_out_padded``: ``in_out`` with a narrow layer (fewer than 16 outputs) computed as one of 16 (its weight, bias and
  output gradient padded with zero columns for the forward and the update; the padded columns never read);
- ``in_out_padded_kept``: the same, its weight and momentum stored padded (``[n, in, 16]``, as a round's steps could
  keep them), so a step pads only its bias and output gradient.

Why: a BLAS's batched GEMM can be several times slower when the product's last dimension (its ``N``) is small — a
classifier's 10 outputs — than the same product transposed or padded. On a 2-core AMD EPYC (AVX2, torch 2.13's MKL)
the ``in_out`` form of logistic regression on digits, 200 clients stacked, took 2× ``out_in``'s time
(results/benchmarks_cpu_2026-12-06b); the transposed forms round a client's product by its place in the stack, and
the padded one costs more than it saves below ~100 stacked clients (results/benchmarks_cpu_2026-12-07). The earlier
CPU results were measured on Intel Xeons, where the forms were never compared: run this there. The shapes are those
of the project's CPU workloads (#74's logistic regression, the default MLP, W1's MLP). Each form's numbers are
checked against ``in_out``'s (they differ by float rounding only: a product's sums in another order), and each
client's step alone against its part of the stack (``{form}_alone_equal``, bit for bit); ``--random-layers N``
counts, of N random narrow layers, those where a client alone differs from its part of the stack, plain
(``in_out``) and padded. Microseconds a step, the fastest of ``--repeats`` timings of ``--steps`` steps;
``over_in_out`` < 1: faster than ``in_out``. Nothing is asserted.

    python benchmarks/dense_forms.py [--threads 2] [--repeats 5] [--steps 50] [--only logreg] [--random-layers 400]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

#: (workload, clients n, batch B, in, out)
SHAPES = [
    ("logreg digits, 1 seed", 10, 32, 64, 10),
    ("logreg digits, 20 seeds stacked", 200, 32, 64, 10),
    ("default MLP hidden", 10, 32, 64, 64),
    ("default MLP head", 10, 32, 64, 10),
    ("default MLP head, 20 seeds stacked", 200, 32, 64, 10),
    ("W1 784→200", 100, 50, 784, 200),
    ("W1 200→200", 100, 50, 200, 200),
    ("W1 head 200→10", 100, 50, 200, 10),
]
LR, MOMENTUM = 0.01, 0.9
#: ``in_out_padded`` computes a layer of fewer outputs than this as one of this many
NARROW = 16


def _padding(width: int) -> tuple[int, int]:
    return (0, max(0, NARROW - width))


def padded_affine(b: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ W + b``, a narrow layer computed as one of :data:`NARROW` outputs (its first ones kept)."""
    pad = _padding(w.shape[2])
    if not pad[1]:
        return torch.baddbmm(b.unsqueeze(1), x, w)
    return torch.baddbmm(F.pad(b, pad).unsqueeze(1), x, F.pad(w, pad))[:, :, :w.shape[2]].contiguous()


def padded_gradient(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``xᵀ g``, a narrow layer's computed as one of :data:`NARROW` outputs (its first columns kept)."""
    return torch.bmm(x.transpose(1, 2), F.pad(g, _padding(g.shape[2])))[:, :, :g.shape[2]]


def step(form: str, x: torch.Tensor, g: torch.Tensor, w: torch.Tensor, b: torch.Tensor, v: torch.Tensor
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """One step's products in ``form``: the layer's output and its input's gradient (``w`` and ``v`` move)."""
    xt, gt = x.transpose(1, 2), g.transpose(1, 2)
    if form == "in_out":
        out = torch.baddbmm(b.unsqueeze(1), x, w)
        g_in = torch.bmm(g, w.transpose(1, 2))
        v.baddbmm_(xt, g, beta=MOMENTUM)
    elif form == "out_in":
        out = torch.baddbmm(b.unsqueeze(1), x, w.transpose(1, 2))
        g_in = torch.bmm(g, w)
        v.baddbmm_(gt, x, beta=MOMENTUM)
    elif form == "in_out_transposed":
        out = torch.baddbmm(b.unsqueeze(2), w.transpose(1, 2), xt).transpose(1, 2).contiguous()
        g_in = torch.bmm(g, w.transpose(1, 2))
        v.mul_(MOMENTUM).add_(torch.bmm(gt, x).transpose(1, 2))
    elif form == "in_out_padded_kept":  # w and v stored [n, in, NARROW] where the layer is narrow
        pad, width = _padding(g.shape[2]), g.shape[2]
        b, g_wide = (F.pad(b, pad), F.pad(g, pad)) if pad[1] else (b, g)
        out = torch.baddbmm(b.unsqueeze(1), x, w)[:, :, :width].contiguous()
        g_in = torch.bmm(g, w[:, :, :width].transpose(1, 2))
        v.baddbmm_(xt, g_wide, beta=MOMENTUM)
    else:
        out = padded_affine(b, x, w)
        g_in = torch.bmm(g, w.transpose(1, 2))
        if g.shape[2] < NARROW:
            v.mul_(MOMENTUM).add_(padded_gradient(x, g))
        else:
            v.baddbmm_(xt, g, beta=MOMENTUM)
    w.add_(v, alpha=-LR)
    return out, g_in


def _fastest(fn: Callable[[], object], repeats: int, steps: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        best = min(best, (time.perf_counter() - start) / steps)
    return best * 1e6


def _alone_equal(form: str, x: torch.Tensor, g: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                 stacked: tuple[torch.Tensor, ...]) -> bool:
    """Whether every client's step alone (a stack of one, from weight ``w``) gives its part of the stack's step
    (``stacked``: its output, input gradient, moved weight and momentum) bit for bit. What executors' parity needs: a
    sequential executor or a Flower node computes a client alone, the vectorised executor in a stack (at another
    place, other padding)."""
    for k in range(x.shape[0]):
        one = slice(k, k + 1)
        wk, vk = w[one].clone(), torch.zeros_like(w[one])
        alone = (*step(form, x[one], g[one], wk, b[one], vk), wk, vk)
        if not all(torch.equal(a, s[one]) for a, s in zip(alone, stacked, strict=True)):
            return False
    return True


def random_layers(trials: int, seed: int = 0) -> dict[str, dict[str, int]]:
    """Of ``trials`` random narrow layers (2–6 clients, batches 1–40, inputs 1–80, 1–15 outputs), in how many a
    client's forward and its weight's gradient computed alone differ from its part of the stack (any bit of any
    client), plain (``in_out``) and padded (``in_out_padded``)."""
    rng = random.Random(seed)
    forms = {"in_out": (lambda b, x, w: torch.baddbmm(b.unsqueeze(1), x, w), lambda x, g: torch.bmm(x.mT, g)),
             "in_out_padded": (padded_affine, padded_gradient)}
    counts = {form: {"forward": 0, "weight_gradient": 0} for form in forms}
    for _ in range(trials):
        n, batch, fan_in, fan_out = rng.randint(2, 6), rng.randint(1, 40), rng.randint(1, 80), rng.randint(1, 15)
        gen = torch.Generator().manual_seed(rng.randrange(1 << 30))
        x, w = torch.randn(n, batch, fan_in, generator=gen), torch.randn(n, fan_in, fan_out, generator=gen)
        b, g = torch.randn(n, fan_out, generator=gen), torch.randn(n, batch, fan_out, generator=gen)
        one = [slice(k, k + 1) for k in range(n)]
        for form, (forward, gradient) in forms.items():
            out, grad = forward(b, x, w), gradient(x, g)
            counts[form]["forward"] += any(not torch.equal(forward(b[k], x[k], w[k]), out[k]) for k in one)
            counts[form]["weight_gradient"] += any(not torch.equal(gradient(x[k], g[k]), grad[k]) for k in one)
    return counts


def measure(n: int, batch: int, fan_in: int, fan_out: int, repeats: int, steps: int) -> dict[str, float]:
    gen = torch.Generator().manual_seed(0)
    x, g = torch.randn(n, batch, fan_in, generator=gen), torch.randn(n, batch, fan_out, generator=gen)
    w0, b = torch.randn(n, fan_in, fan_out, generator=gen) * 0.1, torch.randn(n, fan_out, generator=gen)
    stored = {"in_out": w0, "out_in": w0.transpose(1, 2).contiguous(), "in_out_transposed": w0,
              "in_out_padded": w0, "in_out_padded_kept": F.pad(w0, _padding(fan_out))}
    reference: tuple[torch.Tensor, ...] | None = None
    row: dict[str, float] = {}
    for form, w_init in stored.items():
        w, v = w_init.clone(), torch.zeros_like(w_init)
        out, g_in = step(form, x, g, w, b, v)
        moved = w.transpose(1, 2) if form == "out_in" else w[:, :, :fan_out]
        if reference is None:
            reference = (out, g_in, moved)
        row[f"{form}_max_abs_diff"] = max(float((a - r).abs().max()) for a, r in zip((out, g_in, moved), reference,
                                                                                       strict=True))
        row[f"{form}_alone_equal"] = _alone_equal(form, x, g, w_init, b, (out, g_in, w, v))
        w, v = w_init.clone(), torch.zeros_like(w_init)
        row[f"{form}_us"] = round(_fastest(lambda form=form, w=w, v=v: step(form, x, g, w, b, v), repeats, steps), 1)
    for form in stored:
        row[f"{form}_over_in_out"] = round(row[f"{form}_us"] / row["in_out_us"], 3)
    worst = max(row[f"{form}_max_abs_diff"] for form in stored)
    if worst > 1e-4:  # not one layer's rounding: a form computes something else
        row["error"] = f"the forms' numbers differ by {worst:.2e}"
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--only", default="", help="the workloads whose name holds this text (default: all)")
    parser.add_argument("--random-layers", type=int, default=0,
                        help="also count, of this many random narrow layers, those whose clients alone differ from "
                             "their stack's (random_layers)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    shapes = {name: measure(n, b, i, o, args.repeats, args.steps) | {"clients": n, "batch": b, "in": i, "out": o}
              for name, n, b, i, o in SHAPES if args.only in name}
    print(json.dumps({"threads": args.threads, "torch": torch.__version__,
                      "blas": "mkl" if torch.backends.mkl.is_available() else "other",
                      "cpu_capability": torch.backends.cpu.get_cpu_capability(), "shapes": shapes,
                      "random_layers": {"trials": args.random_layers, **random_layers(args.random_layers)}},
                     indent=1))


if __name__ == "__main__":
    main()
