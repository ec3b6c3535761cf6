"""A plain step's gradients written out, for models whose forward is dense layers and elementwise activations.

Why: a training step of a small stack is bound by its fixed cost, not its arithmetic. Measured on this project's
2-core CPU (2026-11-28, ``benchmarks/step_cost.py``), one client of an MLP 784-200-10 at B = 10: the step's kernels
take ~85 µs, a bare autograd step 186 µs (recording the graph as the forward runs, then the engine's walk over ~10
nodes), and hetfed's step through autograd 249 µs; a one-client MLP 8-8-10, nearly all fixed cost, 86 µs bare. The
same gradients as ~15 tensor operations under ``no_grad`` cost 44 µs bare for the small MLP and 116 µs for the large
one, and hetfed's step with them 71 and 148 µs. A model whose gradients
are written here declares them (:meth:`hetfed.models.base.Model.closed_form`); :func:`hetfed.engine.local.train_stack`
uses them for its plain steps (the model's cross-entropy, at most a proximal term, which is added by its gradient)
and autograd for every other step. The numbers are autograd's to float rounding (tested against it).

A weight's gradient ``xᵀg`` is not made when the step moves its weight (:mod:`hetfed.models.sgd_in_backward`):
there the move is one ``baddbmm_`` in place of the gradient's ``bmm``, so it is taken for every weight, whatever its
size (the hook's Python, which sets a size below which autograd's steps keep the optimiser's update, is not paid
here).
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from functools import partial
from typing import Any

import torch

from hetfed.models import softmax
from hetfed.models.sgd_in_backward import SGDInBackward

#: the fewest elements a weight stack needs for a step written out here to move it (every one: the move replaces the
#: gradient's product, where the hook's Python sets :data:`hetfed.models.sgd_in_backward.MOVE_FROM`)
MOVE_FROM = 0

#: (parameters — the trained ones and any held fixed —, inputs ``[n, b, …]``, labels ``[n, b]``, row mask ``[n, b]``,
#: the step's noise, the weights the step moves) → (each client's mean cross-entropy ``[n]`` over its real rows, the
#: gradients of the trained parameters not moved)
ClosedForm = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]


def declared_by(model: object, cls: type, methods: tuple[str, ...] = ("forward", "features", "head")) -> bool:
    """Whether ``model`` computes with ``cls``'s own ``methods`` (none replaced on a subclass or on the instance): a
    closed form written for ``cls``'s forward holds only then."""
    return all(getattr(getattr(model, m), "__func__", None) is getattr(cls, m) for m in methods)


def for_names(model: Any, cls: type, names: set[str], fn: ClosedForm,
              methods: tuple[str, ...] = ("forward", "features", "head")) -> ClosedForm | None:
    """A model's closed form ``fn`` (taking ``trained``: the names that train, None for all) for a step training
    ``names``: None when there are none, when one is not the model's (``model.specs()``), or when ``cls``'s
    ``methods`` are replaced (:func:`declared_by`)."""
    own = {s.name for s in model.specs()}
    if not names or not names <= own or not declared_by(model, cls, methods):
        return None
    return fn if names == own else partial(fn, trained=frozenset(names))


def cross_entropy(logits: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each client's mean cross-entropy ``[n]`` over its real rows (``mask``: 1 real, 0 padding), and the gradient of
    their sum with respect to the logits ``[n, b, C]``: ``(softmax − onehot) · mask / rows``."""
    logp, grad = softmax.log_softmax_and_softmax(logits)
    at = y.unsqueeze(-1)
    picked = logp.gather(-1, at)  # [n, b, 1]
    weight = (mask / mask.sum(1, keepdim=True).clamp(min=1)).unsqueeze(-1)  # [n, b, 1]
    loss = -(picked * weight).sum((1, 2))
    grad.scatter_add_(-1, at, torch.full_like(picked, -1.0))
    return loss, grad.mul_(weight)


def relu_backward_(g: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """``g`` zeroed, in place, where the ReLU's output ``out`` is 0: the ReLU's backward as autograd computes it
    (``threshold_backward``, one pass). ``g.mul_(out > 0)`` is the same numbers but makes a boolean tensor and a float
    copy of it first: 17.5 against 3.0 µs on a ``[10, 32, 64]`` stack, ~0.3 ms of a 10-step round of the CGAU setting
    on this project's CPU (#74)."""
    return torch.ops.aten.threshold_backward.grad_input(g, out, 0, grad_input=g)


def dense_backward(names: tuple[str, str], x: torch.Tensor, weight: torch.Tensor, g: torch.Tensor,
                   grads: dict[str, torch.Tensor], moving: SGDInBackward | None, input_grad: bool,
                   trained: Container[str] | None = None) -> torch.Tensor | None:
    """The backward of :func:`hetfed.models.base.dense` (``x @ W + b`` over a stack, its weight and bias named
    ``names``) for its output's gradient ``g``: the bias's gradient into ``grads``, the weight's there too or, when
    ``moving`` claims it, its update applied — each only if it trains (``trained``: the names that do; None: all);
    returns the input's gradient (``input_grad``), computed before the weight moves."""
    g_in = torch.bmm(g, weight.transpose(1, 2)) if input_grad else None
    weight_name, bias_name = names
    if trained is None or weight_name in trained:
        name = moving.claim(weight) if moving is not None else None
        if name is None:
            grads[weight_name] = torch.bmm(x.transpose(1, 2), g)
        else:
            assert moving is not None
            moving.move(name, weight, x, g)
    if trained is None or bias_name in trained:
        grads[bias_name] = g.sum(1)
    return g_in


def lowest_trained(layers: Sequence[tuple[str, ...]], trained: Container[str] | None) -> int:
    """The first of ``layers`` (each its parameters' names, input side first) with a parameter that trains: the
    backward stops there (no gradient of the layers below or of the input is needed). 0 when all train."""
    if trained is None:
        return 0
    return next((i for i, names in enumerate(layers) if any(k in trained for k in names)), len(layers))
