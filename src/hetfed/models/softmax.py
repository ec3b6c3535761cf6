"""The log-softmax over a model's classes and the cross-entropy of each row, fast on a CPU for few classes.

Why: torch's CPU log-softmax (2.13) along a last dimension of fewer than 16 values takes a slow path — measured on
this project's 2-core CPU, 2 threads: 7 200 rows of 10 classes 364 µs, the same rows padded to 16 columns 37 µs (2
classes 60 → 38 µs, 8 classes 287 → 37 µs; 16 or more classes are not slow). Every training step and every
evaluation takes one (the MLP's written-out step, autograd's steps, the clients' and the server's scores), and the
steps of a 200-client stack of a 10-class model spent more in it than in their matmuls. Padded with −inf, the rows
give the same function: ``exp(−inf) = 0`` adds nothing to a row's sum (its rounding may differ from the unpadded
kernel's in the last bit). On other devices, and for 16 or more classes, torch's own.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

#: rows of fewer classes than this are padded to it on a CPU (the width torch's vectorised log-softmax serves)
PAD_TO = 16


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
    logp = torch.log_softmax(wide, -1)
    classes = logits.shape[-1]
    return logp[..., :classes], logp.exp()[..., :classes]  # the exponential of the contiguous rows, then the view


def row_cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each row's cross-entropy (``y``'s shape) of ``logits`` ``[…, C]`` and integer labels ``y`` ``[…]``:
    ``F.cross_entropy(…, reduction="none")``'s numbers, through :func:`log_softmax` (differentiable)."""
    return -log_softmax(logits).gather(-1, y.unsqueeze(-1)).squeeze(-1)
