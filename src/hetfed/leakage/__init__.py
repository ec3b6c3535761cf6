"""What the server learns: attacks by an honest-but-curious server on what it really receives (#76).

Each attack is one module of this package registering a :class:`LeakageAttack` (``hetfed components leakage``):

- on a client's **update** (:class:`Observed`: the model the server sent, the client's θ_k − θ, and the protocol
  it knows — the client's step size, local steps, batch size): gradient inversion reconstructs the client's
  samples (``dlg``, ``idlg``, ``inverting_gradients``), scored by PSNR and SSIM against the real ones and by the
  share of labels recovered (:mod:`hetfed.leakage.metrics`);
- on a **model** the server holds or a client publishes (:class:`Queried`: the model and samples whose membership
  is asked): membership inference gives each sample a score, higher for "trained on" (``loss_threshold``), scored
  by the AUC and the TPR at 1 % FPR over members and non-members.

An attack is a pure function of what it reads and its own ``Params`` (a ``ComponentParams`` model in its file), so
a defence is measured by handing it what the defended protocol sends: the DP-noised update, the aggregate under
SecAgg+, the decoded compressed update, a multi-step update.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any, Literal

import torch
import torch.nn.functional as F

from hetfed.models.base import Model, Params
from hetfed.registry import ComponentParams, Registry, describe_params


@dataclass(frozen=True)
class Observed:
    """One client's round as the server holds it: the shared parameters it sent (``params``, one client's: no
    client axis), what came back (``update`` = θ_k − θ on those names) and the protocol it knows (the client's step
    size ``lr``, its ``steps`` local steps of ``batch`` samples, and the shape of a sample)."""

    model: Model
    params: Params
    update: Params
    lr: float
    input_shape: tuple[int, ...]
    steps: int = 1
    batch: int = 1

    @cached_property
    def gradient(self) -> Params:
        """The update read as one step of plain SGD: g = −Δ / lr (exact for FedSGD; a direction otherwise) —
        computed once, not at every evaluation of an attack's objective."""
        return {k: -v / self.lr for k, v in self.update.items()}

    def last_bias_gradient(self, attack: str) -> torch.Tensor:
        """The gradient of the last layer's bias (``[n_classes]``), which iDLG and label_counts read; ``attack``
        names the one asking, for the error on a model without a declared head."""
        head = self.model.head_names
        if head is None:
            raise ValueError(f"model {type(self.model).__name__} declares no head: {attack} reads the last layer's "
                             "bias")
        return self.gradient[head[1]]


@dataclass(frozen=True)
class Queried:
    """A model the server can query (``model`` at ``params``, one client's) and the samples whose membership it
    asks about; ``reference``: samples of the population the attacker holds itself, none of them the target's
    (what a calibrated attack trains its shadow models on)."""

    model: Model
    params: Params
    x: torch.Tensor
    y: torch.Tensor
    reference: tuple[torch.Tensor, torch.Tensor] | None = None


@dataclass(frozen=True)
class Reconstruction:
    """A gradient inversion's answer: samples ``x`` ``[batch, *input]`` with labels ``y`` ``[batch]``, and the
    final distance between their gradient and the observed one."""

    x: torch.Tensor
    y: torch.Tensor
    distance: float


@dataclass(frozen=True)
class LeakageAttack:
    """One registered attack. ``reads``: ``"update"`` (``attack(Observed, params, gen) -> Reconstruction``),
    ``"model"`` (``attack(Queried, params, gen) -> scores [samples]``, higher = more likely a member) or
    ``"nothing"`` (``none``: a run's default, no attack)."""

    name: str
    reads: Literal["update", "model", "nothing"]
    attack: Callable[..., Any]
    Params: type[ComponentParams]
    summary: str
    paper: str = ""
    #: the most samples an update it reads may have been trained on (iDLG: one); None: any
    most_samples: int | None = None

    @property
    def acts(self) -> bool:
        """Whether a run that names it attacks anything (``leakage.kind: none`` does not)."""
        return self.reads != "nothing"


def _described(attack: LeakageAttack) -> dict[str, Any]:
    return {"summary": attack.summary, "paper": attack.paper, "reads": attack.reads,
            "params": describe_params(attack.Params)}


ATTACKS: Registry[LeakageAttack] = Registry("leakage", __name__, "leakage.kind", describe=_described,
                                            exclude=frozenset({"metrics"}), noun="leakage attack")


def register(attack: LeakageAttack) -> LeakageAttack:
    return ATTACKS.register(attack.name, attack)


def run(name: str, target: Observed | Queried, options: dict[str, Any] | None = None, seed: int = 0) -> Any:
    """Attack ``name`` on ``target`` with its parameters ``options`` (validated by its ``Params``)."""
    attack = ATTACKS.get(name)
    params = ATTACKS.params(name, options or {}, f"leakage.{name}")
    return attack.attack(target, params, torch.Generator().manual_seed(seed))


def stacked(params: Params) -> Params:
    """One client's parameters with the client axis a model's forward takes."""
    return {k: v.unsqueeze(0) for k, v in params.items()}


def soft_cross_entropy(model: Model, params: Params, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of ``x`` ``[batch, *input]`` against label distributions ``labels`` ``[batch, C]``
    (one-hot: the training loss) under one client's ``params``."""
    logits = model.forward(stacked(params), x.unsqueeze(0))[0]
    return -(labels * F.log_softmax(logits, -1)).sum(-1).mean()


def gradient(model: Model, params: Params, x: torch.Tensor, labels: torch.Tensor, create_graph: bool = False
             ) -> Params:
    """∇ of :func:`soft_cross_entropy` with respect to ``params`` (``create_graph``: differentiable, for an
    attack that matches gradients)."""
    leaves = {k: v if v.requires_grad else v.detach().requires_grad_(True) for k, v in params.items()}
    loss = soft_cross_entropy(model, leaves, x, labels)
    grads = torch.autograd.grad(loss, list(leaves.values()), create_graph=create_graph)
    return dict(zip(leaves, grads, strict=True))


def observe_step(model: Model, params: Params, x: torch.Tensor, y: torch.Tensor, lr: float = 0.1) -> Observed:
    """What a client sends after one step of plain SGD on the batch ``(x, y)`` from ``params`` (FedSGD, the
    setting of DLG): Δ = −lr·∇. The truth the attack is scored against stays with the caller."""
    g = gradient(model, params, x, F.one_hot(y, model.n_classes).to(x.dtype))
    return Observed(model, {k: v.detach() for k, v in params.items()}, {k: -lr * v for k, v in g.items()}, lr,
                    tuple(x.shape[1:]), steps=1, batch=len(y))


def observe_local(model: Model, params: Params, x: torch.Tensor, y: torch.Tensor, lr: float, steps: int,
                  batch: int) -> Observed:
    """What a client sends after ``steps`` steps of plain SGD on minibatches of ``batch`` of its samples ``(x, y)``
    taken in order (FedAvg's local update): the attack still reads it as one step on all of them."""
    current = {k: v.detach() for k, v in params.items()}
    onehot = F.one_hot(y, model.n_classes).to(x.dtype)
    for step in range(steps):
        at = (step * batch) % len(y)
        idx = torch.arange(at, at + batch) % len(y)
        g = gradient(model, current, x[idx], onehot[idx])
        current = {k: current[k] - lr * g[k] for k in current}
    return Observed(model, {k: v.detach() for k, v in params.items()},
                    {k: (current[k] - params[k]).detach() for k in current}, lr, tuple(x.shape[1:]), steps=1,
                    batch=len(y))


def compressed(observed: Observed, section: Any, seed: int = 0) -> Observed:
    """The update as the server decodes it under ``server.compression`` (a section, or ``{"kind": …, …}``): what
    a compressing protocol hands the attack."""
    from hetfed.server.compression import parse

    compressor, params = parse(section)
    update = {k: compressor.received(v.unsqueeze(0), [seed], i, params)[0].to(v.dtype)
              for i, (k, v) in enumerate(observed.update.items())}
    return replace(observed, update=update)


def summed(observed: list[Observed]) -> Observed:
    """What the server holds under secure aggregation (SecAgg+): only the mean of the round's updates — read as
    one client's batch of all their samples (exact for FedSGD clients of equal batches from one model)."""
    first = observed[0]
    update = {k: torch.stack([o.update[k] for o in observed]).mean(0) for k in first.update}
    return replace(first, update=update, batch=sum(o.batch for o in observed))


def label_from_last_layer(observed: Observed) -> torch.Tensor:
    """iDLG's rule (Zhao et al. 2020) for a batch of one: the gradient of the cross-entropy with respect to the
    last layer's bias is softmax − onehot, negative only at the true label."""
    return torch.argmin(observed.last_bias_gradient("iDLG")).reshape(1)
