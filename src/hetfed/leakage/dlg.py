"""``dlg``: Deep Leakage from Gradients (Zhu, Liu, Han, NeurIPS 2019): dummy samples and soft labels optimised by
L-BFGS until their gradient matches the observed one in squared L2."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from pydantic import Field

from hetfed.leakage import LeakageAttack, Observed, Reconstruction, gradient, register
from hetfed.registry import ComponentParams


class DLGParams(ComponentParams):
    iterations: int = Field(30, ge=1, description="L-BFGS outer steps (each up to 20 inner evaluations)")
    lr: float = Field(1.0, gt=0, description="L-BFGS's step size")


def distance(observed: Observed, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Σ over the shared parameters of ‖∇(x, labels) − g‖², g the observed gradient (the paper's objective)."""
    target = observed.gradient
    g = gradient(observed.model, observed.params, x, labels, create_graph=True)
    return torch.stack([((g[k] - target[k]) ** 2).sum() for k in target]).sum()


def matched(observed: Observed, x: torch.Tensor, labels: Callable[[], torch.Tensor], leaves: list[torch.Tensor],
            params: DLGParams) -> Reconstruction:
    """Minimise :func:`distance` over ``leaves`` (the dummies ``x``, and the label logits when they are unknown)
    by L-BFGS with a strong Wolfe line search; ``labels()``: the current label distributions."""
    opt = torch.optim.LBFGS(leaves, lr=params.lr, max_iter=20, history_size=100, line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        d = distance(observed, x, labels())
        d.backward()
        return d

    for _ in range(params.iterations):
        opt.step(closure)
    final = float(distance(observed, x, labels()).detach())
    return Reconstruction(x.detach().clone(), labels().argmax(-1).detach(), final)


def dlg(observed: Observed, params: DLGParams, gen: torch.Generator) -> Reconstruction:
    x = torch.rand((observed.batch, *observed.input_shape), generator=gen).requires_grad_(True)
    logits = torch.randn(observed.batch, observed.model.n_classes, generator=gen).requires_grad_(True)
    return matched(observed, x, lambda: F.softmax(logits, -1), [x, logits], params)


register(LeakageAttack("dlg", "update", dlg, DLGParams, "gradient inversion: dummy samples and soft labels "
                       "matched to the observed gradient (L2, L-BFGS)", "Zhu et al., NeurIPS 2019"))
