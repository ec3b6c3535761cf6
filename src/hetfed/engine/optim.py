"""Client optimisers as pure functions over stacked parameters.

State lives in a plain dict so that it can be reset each round or kept on the
client across rounds (``optimizer.reset_each_round``: the CGAU paper's footnote
shows the choice matters). ``active`` masks clients that have finished their
local work in a stack: their parameters and state do not move.
Matches ``torch.optim.SGD`` (momentum, dampening 0) and ``torch.optim.Adam``.
"""

from __future__ import annotations

import torch

from hetfed.config import OptimizerConfig

Params = dict[str, torch.Tensor]


def _where(active: torch.Tensor, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    return torch.where(active.view(-1, *([1] * (new.ndim - 1))), new, old)


def init_state(cfg: OptimizerConfig, params: Params) -> Params:
    """Fresh optimiser state for stacked params (keys prefixed ``opt.``)."""
    n = next(iter(params.values())).shape[0]
    if cfg.kind == "sgd":
        if cfg.momentum == 0:
            return {}
        return {f"opt.mom.{k}": torch.zeros_like(v) for k, v in params.items()}
    state = {f"opt.m.{k}": torch.zeros_like(v) for k, v in params.items()}
    state.update({f"opt.v.{k}": torch.zeros_like(v) for k, v in params.items()})
    state["opt.t"] = torch.zeros(n, device=next(iter(params.values())).device)
    return state


def step(cfg: OptimizerConfig, params: Params, grads: Params, state: Params, lr: float, active: torch.Tensor) -> tuple[Params, Params]:
    """One optimiser step for every active client of the stack."""
    new_p: Params = {}
    new_s: Params = dict(state)
    if cfg.kind == "sgd":
        for k, p in params.items():
            g = grads[k] + cfg.weight_decay * p if cfg.weight_decay else grads[k]
            if cfg.momentum:
                buf = state[f"opt.mom.{k}"]
                # torch.optim.SGD: the first step sets buf = g (dampening 0 → same as 0·buf + g)
                buf_new = cfg.momentum * buf + g
                new_s[f"opt.mom.{k}"] = _where(active, buf_new, buf)
                g = buf_new
            new_p[k] = _where(active, p - lr * g, p)
        return new_p, new_s
    b1, b2 = cfg.betas
    t_old = state["opt.t"]
    t = t_old + active.float()
    new_s["opt.t"] = t
    t_safe = t.clamp(min=1)
    for k, p in params.items():
        g = grads[k] + cfg.weight_decay * p if cfg.weight_decay else grads[k]
        m = b1 * state[f"opt.m.{k}"] + (1 - b1) * g
        v = b2 * state[f"opt.v.{k}"] + (1 - b2) * g * g
        shape = (-1, *([1] * (p.ndim - 1)))
        m_hat = m / (1 - b1 ** t_safe).view(shape)
        v_hat = v / (1 - b2 ** t_safe).view(shape)
        new_p[k] = _where(active, p - lr * m_hat / (v_hat.sqrt() + cfg.eps), p)
        new_s[f"opt.m.{k}"] = _where(active, m, state[f"opt.m.{k}"])
        new_s[f"opt.v.{k}"] = _where(active, v, state[f"opt.v.{k}"])
    return new_p, new_s
