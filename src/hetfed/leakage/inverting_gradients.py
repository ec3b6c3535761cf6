"""``inverting_gradients``: Inverting Gradients (Geiping, Bauermeister, Dröge, Moeller, NeurIPS 2020): the cosine
distance between the dummy's gradient and the observed one (so the update's scale — a step size, several local
steps — matters less) plus total variation on image-shaped samples, minimised by Adam on the signed gradient."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from hetfed.leakage import (
    LeakageAttack,
    Observed,
    Reconstruction,
    gradient,
    label_from_last_layer,
    register,
)
from hetfed.registry import ComponentParams


class InvertingParams(ComponentParams):
    iterations: int = Field(2000, ge=1, description="Adam steps")
    lr: float = Field(0.1, gt=0, description="Adam's step size (on the signed gradient, as the paper)")
    tv: float = Field(1e-4, ge=0, description="weight of the total variation prior (images)")


def cosine(observed: Observed, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    target = observed.gradient
    g = gradient(observed.model, observed.params, x, labels, create_graph=True)
    dot = torch.stack([(g[k] * target[k]).sum() for k in target]).sum()
    norms = (torch.stack([(g[k] ** 2).sum() for k in target]).sum().sqrt()
             * torch.stack([(target[k] ** 2).sum() for k in target]).sum().sqrt())
    return 1 - dot / norms.clamp(min=1e-12)


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Mean absolute difference of neighbouring pixels (samples ``[batch, H, W]``); 0 for vectors."""
    if x.dim() < 3:
        return x.new_zeros(())
    return (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., :, 1:] - x[..., :, :-1]).abs().mean()


def inverting_gradients(observed: Observed, params: InvertingParams, gen: torch.Generator) -> Reconstruction:
    if observed.batch == 1:
        labels = F.one_hot(label_from_last_layer(observed), observed.model.n_classes).to(torch.float32)
        logits = None
    else:
        logits = torch.randn(observed.batch, observed.model.n_classes, generator=gen).requires_grad_(True)
    x = torch.rand((observed.batch, *observed.input_shape), generator=gen).requires_grad_(True)
    opt = torch.optim.Adam([x] if logits is None else [x, logits], lr=params.lr)
    for _ in range(params.iterations):
        opt.zero_grad()
        current = labels if logits is None else F.softmax(logits, -1)
        loss = cosine(observed, x, current) + params.tv * total_variation(x)
        loss.backward()
        for leaf in [x] if logits is None else [x, logits]:
            leaf.grad.sign_()  # type: ignore[union-attr]
        opt.step()
        with torch.no_grad():
            x.clamp_(0, 1)
    final = labels if logits is None else F.softmax(logits, -1)
    return Reconstruction(x.detach().clone(), final.argmax(-1).detach(), float(cosine(observed, x, final).detach()))


register(LeakageAttack("inverting_gradients", "update", inverting_gradients, InvertingParams,
                       "gradient inversion by cosine distance and total variation (Adam on signed gradients)",
                       "Geiping et al., NeurIPS 2020"))
