"""Client optimisers as functions over stacked parameters, updating in place.

State lives in a plain dict so that it can be reset each round or kept on the
client across rounds (``optimizer.reset_each_round``: the CGAU paper's footnote
shows the choice matters). ``active`` masks clients that have finished their
local work in a stack: their parameters and state do not move.
Matches ``torch.optim.SGD`` (momentum, dampening 0), ``torch.optim.Adam`` (weight decay added to the gradient) and
``torch.optim.AdamW`` (weight decay decoupled: the parameter shrunk by ``lr · weight_decay`` before Adam's step,
Loshchilov & Hutter 2019 — the optimiser adapters and transformers are fine-tuned with).

Updates are in place, with a fast path when every client of the stack is
active: a masked ``torch.where`` over a stack of 100 clients' weights costs
~35× an in-place update (it streams the whole stack through memory several
times), which made the vectorised executor slower than the sequential one.
Callers own the tensors they pass (``train_stack`` copies its inputs first).
"""

from __future__ import annotations

import torch

from hetfed.config import OptimizerConfig

Params = dict[str, torch.Tensor]


def _view(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return t.view(-1, *([1] * (like.ndim - 1)))


def init_state(cfg: OptimizerConfig, params: Params) -> Params:
    """Fresh optimiser state for stacked params (keys prefixed ``opt.``; Adam's and AdamW's are the same)."""
    n = next(iter(params.values())).shape[0]
    if cfg.kind == "sgd":
        if cfg.momentum == 0:
            return {}
        return {f"opt.mom.{k}": torch.zeros_like(v) for k, v in params.items()}
    state = {f"opt.m.{k}": torch.zeros_like(v) for k, v in params.items()}
    state.update({f"opt.v.{k}": torch.zeros_like(v) for k, v in params.items()})
    state["opt.t"] = torch.zeros(n, device=next(iter(params.values())).device)
    return state


def momentum_buffers(cfg: OptimizerConfig, state: Params, names: list[str]) -> Params:
    """SGD's momentum buffers of ``names`` in ``state`` (none without momentum), by parameter name."""
    return {k: state[f"opt.mom.{k}"] for k in names} if cfg.kind == "sgd" and cfg.momentum else {}


def step(cfg: OptimizerConfig, params: Params, grads: Params, state: Params, lr: float, active: torch.Tensor,
         every: bool | None = None) -> tuple[Params, Params]:
    """One optimiser step, in place, for every active client of the stack.

    ``every`` says whether every client is active when the caller knows it (its plan does): reading it
    from ``active`` is a host round-trip on an accelerator.
    """
    every = bool(active.all()) if every is None else every
    if cfg.kind == "sgd":
        _sgd(cfg, params, grads, state, lr, active, every)
    else:
        _adam(cfg, params, grads, state, lr, active, every)
    return params, state


def _sgd(cfg: OptimizerConfig, params: Params, grads: Params, state: Params, lr: float, active: torch.Tensor,
         every: bool) -> None:
    if every:
        _sgd_every(cfg, params, grads, state, lr)
        return
    a = active.to(next(iter(params.values())).dtype) if not every else active
    keep = torch.where(active, cfg.momentum, 1.0) if not every else None
    for k, p in params.items():
        g = grads[k].add(p, alpha=cfg.weight_decay) if cfg.weight_decay else grads[k]
        if not every:
            g = g * _view(a, g)
        if cfg.momentum:
            buf = state[f"opt.mom.{k}"]
            assert buf is not None
            if keep is None:
                buf.mul_(cfg.momentum).add_(g)
            else:
                buf.mul_(_view(keep, buf)).add_(g)
            g = buf if every else buf * _view(a, buf)
        p.add_(g, alpha=-lr)


def _sgd_every(cfg: OptimizerConfig, params: Params, grads: Params, state: Params, lr: float) -> None:
    """:func:`_sgd` when every client is active: the same operations, in order, as one call per operation over
    all parameters (``torch._foreach_*``) instead of one per parameter — a step of a small model (the CGAU
    setting's) is launch-bound, and the per-parameter loop was ~0.1 ms of it."""
    names = list(params)
    ps = [params[k] for k in names]
    gs = [grads[k] for k in names]
    if cfg.weight_decay:
        gs = list(torch._foreach_add(gs, ps, alpha=cfg.weight_decay))
    if cfg.momentum:
        bufs = [state[f"opt.mom.{k}"] for k in names]
        torch._foreach_mul_(bufs, cfg.momentum)
        torch._foreach_add_(bufs, gs)
        gs = bufs
    torch._foreach_add_(ps, gs, alpha=-lr)


def _adam(cfg: OptimizerConfig, params: Params, grads: Params, state: Params, lr: float, active: torch.Tensor,
          every: bool) -> None:
    b1, b2 = cfg.betas
    a = active.to(next(iter(params.values())).dtype)
    state["opt.t"].add_(a)
    t = state["opt.t"].clamp(min=1)
    bc1, bc2 = 1 - b1**t, 1 - b2**t
    keep1 = torch.where(active, b1, 1.0)
    keep2 = torch.where(active, b2, 1.0)
    coupled = cfg.weight_decay and cfg.kind == "adam"
    decoupled = cfg.weight_decay and cfg.kind == "adamw"
    for k, p in params.items():
        g = grads[k].add(p, alpha=cfg.weight_decay) if coupled else grads[k]
        if decoupled:  # AdamW: the parameter itself shrinks, the active clients' only
            p.mul_(1 - lr * cfg.weight_decay if every else _view(1 - lr * cfg.weight_decay * a, p))
        m, v = state[f"opt.m.{k}"], state[f"opt.v.{k}"]
        if every:
            m.mul_(b1).add_(g, alpha=1 - b1)
            v.mul_(b2).addcmul_(g, g, value=1 - b2)
        else:
            ga = g * _view(a, g)
            m.mul_(_view(keep1, m)).add_(ga, alpha=1 - b1)
            v.mul_(_view(keep2, v)).addcmul_(ga, g, value=1 - b2)
        denom = (v.sqrt() / _view(bc2.sqrt(), v)).add_(cfg.eps)
        upd = (m / denom).mul_(_view(lr / bc1, m))
        if not every:
            upd.mul_(_view(a, upd))
        p.sub_(upd)
