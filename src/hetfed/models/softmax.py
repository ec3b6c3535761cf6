"""The log-softmax over a model's classes and the cross-entropy of each row, fast on a CPU for few classes.

Why: torch's CPU log-softmax (2.13) along a last dimension narrower than its vector of floats takes a slow path —
16 floats where the CPU has AVX-512, 8 with AVX2. Measured with 2 threads: on an AVX-512 2-core CPU, 7 200 rows of
10 classes 364 µs, the same rows padded to 16 columns 37 µs (2 classes 60 → 38 µs, 8 classes 287 → 37 µs); on an
AVX2 2-core AMD EPYC, 7 classes 380 µs, padded to 8 76 µs, while 10 classes are not slow there and padding them to
16 made a step's log-softmax and softmax 1.8× slower (134 → 239 µs for 200 × 32 rows: the exponential of the
−inf columns is slow). Every training step and every evaluation takes one (the MLP's written-out step, autograd's
steps, the clients' and the server's scores), and the steps of a 200-client stack of a 10-class model spent more in
it than in their matmuls. Padded with −inf, the rows give the same function: ``exp(−inf) = 0`` adds nothing to a
row's sum (its rounding may differ from the unpadded kernel's in the last bit). On other devices, and for classes
as wide as the vector, torch's own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def pad_width(capability: str) -> int:
    """The floats in one of torch's CPU vectors for ``torch.backends.cpu.get_cpu_capability()``: the width its
    vectorised log-softmax serves (16 with AVX-512, else 8: AVX2, and the 256-bit default of other CPUs)."""
    return 16 if capability.startswith("AVX512") else 8


#: rows of fewer classes than this are padded to it on a CPU (the width torch's vectorised log-softmax serves)
PAD_TO = pad_width(torch.backends.cpu.get_cpu_capability())


def padded(logits: torch.Tensor) -> torch.Tensor | None:
    """``logits`` with −inf columns up to :data:`PAD_TO`, where torch's own (log-)softmax would be slow; else None
    (``benchmarks/engine.py``'s written-out ideal pads where hetfed's step does through this)."""
    classes = logits.shape[-1]
    if logits.device.type != "cpu" or classes >= PAD_TO:
        return None
    return F.pad(logits, (0, PAD_TO - classes), value=float("-inf"))


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """``log_softmax(logits, -1)`` (differentiable); on a CPU with few classes, a view of a padded result."""
    wide = padded(logits)
    if wide is None:
        return torch.log_softmax(logits, -1)
    return torch.log_softmax(wide, -1)[..., : logits.shape[-1]]


def log_softmax_and_softmax(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log_softmax(logits), softmax(logits))``, the second the exponential of the first (a new tensor the caller
    may change in place): what a written-out cross-entropy's loss and gradient need."""
    wide = padded(logits)
    if wide is None:
        logp = torch.log_softmax(logits, -1)
        return logp, logp.exp()
    logp = torch.log_softmax(wide, -1)[..., : logits.shape[-1]]
    # the real columns copied out, then their exponential: the −inf columns' exponential is slow (a 200 × 32-row
    # stack of 10 classes, AVX-512 AMD EPYC: 143 µs for the padded rows, 46 µs copied; the same numbers). Cloned, not
    # made contiguous: one row's view is contiguous already, and the caller changes the softmax in place
    return logp, logp.clone(memory_format=torch.contiguous_format).exp_()


def row_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each row's cross-entropy (``y``'s shape) of ``logits`` ``[…, C]`` and integer labels ``y`` ``[…]``:
    ``F.cross_entropy(…, reduction="none")``'s numbers, through :func:`log_softmax` (differentiable)."""
    return -log_softmax(logits).gather(-1, y.unsqueeze(-1)).squeeze(-1)
