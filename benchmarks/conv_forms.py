"""Which form of a stack of clients' convolutions is fastest on this device: one training step (forward +
backward) of PFLlib's CNN (``cnn4``) for ``m`` clients with their own weights, batch ``B``, in each form.

- ``vmap``: ``torch.func.vmap`` over the clients (PyTorch turns it into one grouped convolution; hetfed's form
  on accelerators);
- ``vmap_benchmark``: the same with ``torch.backends.cudnn.benchmark`` on (cuDNN times its algorithms first);
- ``unfold_bmm``: im2col (``F.unfold``) and one batched matmul per layer over the clients;
- ``loop``: one plain convolution per client (hetfed's form on a CPU).

Milliseconds per step, the fastest of a few repeats after a warm-up; the forms' outputs are checked equal first.
With ``--capture`` (CUDA) each form's step is also recorded as one CUDA graph and replayed (what hetfed's
``train.capture: auto`` does on a GPU): eager steps are bound by their kernels' launches, replayed ones by the
kernels themselves, so the form that wins can differ. Nothing is asserted.

    python benchmarks/conv_forms.py [--device cpu|cuda] [--clients 1 7 20] [--batch 10] [--capture]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time

import torch
import torch.nn.functional as F
from torch.func import vmap

#: PFLlib's FedAvgCNN on 28 × 28 × 1: the shape of each parameter, and its multiply-adds per image
SHAPES = [(32, 1, 5, 5), (32,), (64, 32, 5, 5), (64,), (512, 1024), (512,), (10, 512), (10,)]
MACS = 24 * 24 * 32 * 25 + 8 * 8 * 64 * 32 * 25 + 1024 * 512 + 512 * 10


def one(p: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """One client's batch through PFLlib's CNN (conv 32 → pool → conv 64 → pool → fc 512 → fc 10)."""
    h = F.relu(F.max_pool2d(F.conv2d(x, p[0], p[1]), 2))
    h = F.relu(F.max_pool2d(F.conv2d(h, p[2], p[3]), 2))
    return F.linear(F.relu(F.linear(h.flatten(1), p[4], p[5])), p[6], p[7])


def _conv_bmm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """x [m, B, C, H, W], w [m, O, C, k, k], b [m, O] → [m, B, O, H−k+1, W−k+1] as im2col + bmm."""
    m, batch, c, h, width = x.shape
    o, k = w.shape[1], w.shape[-1]
    cols = F.unfold(x.reshape(m * batch, c, h, width), k)  # [m·B, C·k², L]
    length = cols.shape[-1]
    cols = cols.view(m, batch, c * k * k, length).transpose(2, 3).reshape(m, batch * length, c * k * k)
    out = torch.baddbmm(b.unsqueeze(1), cols, w.reshape(m, o, c * k * k).transpose(1, 2))  # [m, B·L, O]
    side = h - k + 1
    return out.view(m, batch, side, side, o).permute(0, 1, 4, 2, 3)


def _pool(x: torch.Tensor) -> torch.Tensor:
    m, batch = x.shape[:2]
    return F.max_pool2d(x.flatten(0, 1), 2).unflatten(0, (m, batch))


def unfold_bmm(p: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    h = F.relu(_pool(_conv_bmm(x, p[0], p[1])))
    h = F.relu(_pool(_conv_bmm(h, p[2], p[3]))).flatten(2)
    h = F.relu(torch.baddbmm(p[5].unsqueeze(1), h, p[4].transpose(1, 2)))
    return torch.baddbmm(p[7].unsqueeze(1), h, p[6].transpose(1, 2))


def loop(p: list[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    per = [t.unbind(0) for t in p]
    return torch.stack([one([t[i] for t in per], x[i]) for i in range(x.shape[0])])


FORMS = {"vmap": vmap(one), "vmap_benchmark": vmap(one), "unfold_bmm": unfold_bmm, "loop": loop}


def step_ms(form: str, m: int, batch: int, device: str, captured: bool = False, repeats: int = 5,
            steps: int = 20) -> float:
    """One SGD step of ``m`` clients' CNNs in ``form``, eager or (``captured``) replayed from a CUDA graph."""
    torch.backends.cudnn.benchmark = form == "vmap_benchmark"
    gen = torch.Generator().manual_seed(0)
    params = [(torch.randn(m, *s, generator=gen) * 0.05).to(device).requires_grad_(True) for s in SHAPES]
    x = torch.randn(m, batch, 1, 28, 28, generator=gen).to(device)
    y = torch.randint(0, 10, (m, batch), generator=gen).to(device)
    fn = FORMS[form]

    def one() -> None:
        loss = F.cross_entropy(fn(params, x).reshape(-1, 10), y.reshape(-1))
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads, strict=True):
                p.sub_(g, alpha=1e-3)

    side = torch.cuda.Stream() if device == "cuda" else None  # type: ignore[no-untyped-call]
    if side is not None:
        side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side) if side is not None else contextlib.nullcontext():
        for _ in range(3):
            one()
    if side is not None:
        torch.cuda.current_stream().wait_stream(side)
    run = one
    if captured:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            one()
        run = graph.replay
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            run()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / steps)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 7, 20])
    ap.add_argument("--batch", type=int, default=10)
    ap.add_argument("--capture", action="store_true", help="also each form's step replayed from a CUDA graph")
    args = ap.parse_args()
    if args.capture and args.device != "cuda":
        ap.error(f"--capture records CUDA graphs: --device cuda, not {args.device!r}")
    gen = torch.Generator().manual_seed(1)
    p = [(torch.randn(3, *s, generator=gen) * 0.05).to(args.device) for s in SHAPES]
    x = torch.randn(3, 4, 1, 28, 28, generator=gen).to(args.device)
    ref = loop(p, x)
    check = {f: float((FORMS[f](p, x) - ref).abs().max()) for f in FORMS}
    rows = {m: {f: round(step_ms(f, m, args.batch, args.device), 3) for f in FORMS} for m in args.clients}
    out = {"device": args.device, "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
           "batch": args.batch, "gflop_per_client_step": round(6 * MACS * args.batch / 1e9, 4),
           "max_abs_diff_vs_loop": check, "ms_per_step": rows}
    if args.capture:
        out["ms_per_step_captured"] = {m: {f: round(step_ms(f, m, args.batch, "cuda", captured=True), 3)
                                           for f in FORMS} for m in args.clients}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
