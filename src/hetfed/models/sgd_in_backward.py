"""A linear layer's SGD update applied inside its backward, where its weight gradient is made.

With SGD, a stacked linear layer's weight gradient ``xᵀg`` ``[n, in, out]`` is written only to be read back once by
the optimiser: ``W ← W − lr·(xᵀg + decay·W + μ·(W − c))``, or through a momentum buffer. On a CPU, where a stacked
step is memory-bound, those are two of the step's five passes over each weight stack (more with momentum). Here the
backward of :func:`linear` instead moves the weight itself, ``W ← β·W − lr·xᵀg (+ lr·μ·c)`` with
``β = 1 − lr·(decay + μ)``, as one ``baddbmm_`` into ``W`` (with momentum: one ``baddbmm_`` into the buffer, then
the weight's update) — after the layer's backward has used ``W`` for the input's gradient — and autograd computes
no gradient for it.
Measured on this project's 2-core CPU, 20 clients' 784×200 weights at B = 10: 1.17 ms for the gradient and the
update, 0.29 ms as one ``baddbmm_``; W1's round (``benchmarks/engine.py --compare-moves``) 0.538 → 0.433 s
(docs/scale.md).

A model whose step is written out in closed form (:mod:`hetfed.models.closed_form`: MLP, CGAU) has no autograd
backward to hook: its backward calls :meth:`SGDInBackward.move` itself, for every weight whatever its size.

Only the step that knows its optimiser can ask for it (:func:`hetfed.engine.local.train_stack`: plain steps under
SGD, every computed client training): it names the weights that may move (:class:`SGDInBackward`)
for the forward it runs (:func:`updating`). A weight a forward uses more than once keeps its ordinary gradient
(its other uses' backwards read it after this one would have moved it): its uses' gradients are held for the
caller's optimiser (``SGDInBackward.held``). A weight used elsewhere as well gets the other uses' gradient from
autograd, which the caller's optimiser applies. ``SGDInBackward.moved`` says which weights were moved.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch

from hetfed.models.scoped import bound

#: a weight stack of fewer elements keeps its ordinary gradient: the passes over memory it would save cost less than
#: the hook's Python (~11 µs a layer and step). On this project's CPU, a 784×200 stack at B = 10 saves 14 µs for one
#: client (156 800 elements), 42 µs for 3, 141 µs for 10; a 200×200 one at B = 50, 5 µs for one client (40 000)
MOVE_FROM = 1 << 18


def fewest_clients(per_client: list[int]) -> int:
    """The fewest clients a stack needs for one of its weights (``per_client``: each weight's elements for one
    client) to be moved (at least :data:`MOVE_FROM` elements); 0 when there is no weight."""
    largest = max(per_client, default=0)
    return max(1, -(-MOVE_FROM // largest)) if largest else 0


@dataclass
class SGDInBackward:
    """The weights (leaf tensors ``[n, in, out]`` by name) that one step's backward moves, and how."""

    weights: dict[str, torch.Tensor]
    lr: float
    #: the weight's own gradient term: weight decay + the proximal weight μ
    decay: float = 0.0
    #: a proximal term's centre per weight (``[n, in, out]`` or one model's ``[in, out]``) and its weight μ
    centres: dict[str, torch.Tensor] = field(default_factory=dict)
    mu: float = 0.0
    #: SGD's momentum and its buffers by weight name (``v ← m·v + ∇``, ``W ← W − lr·v``)
    momentum: float = 0.0
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    #: the weights whose update was applied in the backward (autograd hands back no gradient for them)
    moved: set[str] = field(default_factory=set)
    #: the gradients of the weights that were not moved (used more than once), by name
    held: dict[str, torch.Tensor] = field(default_factory=dict)
    #: the fewest elements a weight stack needs to be moved (:data:`MOVE_FROM` through the hook; a step written out
    #: in closed form, :mod:`hetfed.models.closed_form`, moves every weight)
    smallest: int | None = None
    _names: dict[int, str] = field(default_factory=dict, init=False)
    _uses: dict[int, int] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        smallest = MOVE_FROM if self.smallest is None else self.smallest
        self._names = {id(w): k for k, w in self.weights.items() if w.numel() >= smallest}

    def again(self) -> SGDInBackward:
        """This spec for another step over the same tensors (what the last one moved, held and counted forgotten)."""
        self.moved.clear()
        self.held.clear()
        self._uses.clear()
        return self

    def claim(self, weight: torch.Tensor) -> str | None:
        """The weight's name if this step may move it (a use counted), else None."""
        name = self._names.get(id(weight))
        if name is not None:
            self._uses[id(weight)] = self._uses.get(id(weight), 0) + 1
        return name

    def release(self, weight: torch.Tensor) -> None:
        """Count one more use, one that keeps autograd's gradient (after a :meth:`claim` whose use cannot be moved):
        the weight then counts as used twice or more, so none of its uses moves it."""
        self._uses[id(weight)] = self._uses.get(id(weight), 0) + 1

    def move(self, name: str, weight: torch.Tensor, x: torch.Tensor, g: torch.Tensor) -> None:
        """Apply the weight's update from its layer's input ``x`` and output gradient ``g``. A weight the forward
        used more than once is not moved: each use's gradient is added to :attr:`held`, for the optimiser."""
        with torch.no_grad() if torch.is_grad_enabled() else nullcontext():  # a backward or a closed form: off
            if self._uses.get(id(weight), 0) != 1:
                grad = x.transpose(1, 2).bmm(g)
                self.held[name] = grad if name not in self.held else self.held[name] + grad
                return
            if self.momentum:  # v ← m·v + xᵀg + decay·W − μ·c, then W ← W − lr·v
                buffer = self.buffers[name]
                buffer.baddbmm_(x.transpose(1, 2), g, beta=self.momentum)
                if self.decay:
                    buffer.add_(weight, alpha=self.decay)
                if name in self.centres:
                    buffer.add_(self.centres[name], alpha=-self.mu)
                weight.add_(buffer, alpha=-self.lr)
            else:  # W ← (1 − lr·decay)·W − lr·xᵀg + lr·μ·c
                weight.baddbmm_(x.transpose(1, 2), g, beta=1.0 - self.lr * self.decay, alpha=-self.lr)
                if name in self.centres:
                    weight.add_(self.centres[name], alpha=self.lr * self.mu)
        self.moved.add(name)


Layer = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]
_SPEC: ContextVar[SGDInBackward | None] = ContextVar("hetfed_sgd_in_backward", default=None)
_RECORDED: ContextVar[list[Layer] | None] = ContextVar("hetfed_recorded_layers", default=None)


def updating(spec: SGDInBackward) -> AbstractContextManager[SGDInBackward]:
    """Within: :func:`linear` layers over ``spec``'s weights move them in their backward (the forward must run
    here; the backward, which autograd may run on another thread, reads the spec its forward saved)."""
    return bound(_SPEC, spec)


def recording() -> AbstractContextManager[list[Layer]]:
    """Within, with autograd on: every :func:`linear` layer's ``(x, W, b, output)`` is appended to the list yielded
    (this thread): what DP-SGD's per-sample gradient norms read (:func:`hetfed.engine.record_dp.ghost_norms`)."""
    layers: list[Layer] = []
    return bound(_RECORDED, layers)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``x @ W + b`` over a stack (x ``[n, b, in]``, W ``[n, in, out]``, b ``[n, out]``), its weight moved in the
    backward when a step asked for it (:func:`updating`).

    The weight enters the product detached, so autograd computes no gradient for it; a hook on the product's
    backward node, which runs once that node has used the weight for the input's gradient, moves it (a hook, not
    a custom ``autograd.Function``: the Function's Python forward and backward cost ~35 µs a layer and a step,
    more than the update saves on one client).

    Without autograd (a closed-form step's forward, an evaluation) neither applies, and the context is not read:
    a step compiled by ``torch.compile`` cannot read a ``ContextVar`` (dynamo refuses ``ContextVar.get``), and
    CGAU's compiled closed-form step failed on it. Nor is it read in a compiled step that does use autograd (a
    method's declared loss, :class:`hetfed.engine.local.StackObjective`): such a step never moves weights in its
    backward (only a plain step does) and is never DP-SGD's (which records its layers), so neither applies there."""
    if not torch.is_grad_enabled() or torch.compiler.is_compiling():
        return torch.baddbmm(bias.unsqueeze(1), x, weight)
    recorded = _RECORDED.get()
    if recorded is not None:
        out = torch.baddbmm(bias.unsqueeze(1), x, weight)
        recorded.append((x, weight, bias, out))
        return out
    spec = _SPEC.get()
    name = spec.claim(weight) if spec is not None else None
    if name is None:
        return torch.baddbmm(bias.unsqueeze(1), x, weight)
    assert spec is not None
    if not bias.requires_grad:  # autograd runs only the nodes on a path to a trained tensor: the bias is this one's
        spec.release(weight)
        return torch.baddbmm(bias.unsqueeze(1), x, weight)
    out = torch.baddbmm(bias.unsqueeze(1), x, weight.detach())
    assert out.grad_fn is not None
    out.grad_fn.register_hook(lambda _inputs, outputs: spec.move(name, weight, x, outputs[0]))
    return out
