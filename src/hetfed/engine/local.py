"""Local training of a stack of clients: the shared inner loop of every method.

Each client's batches come from its own numpy stream (its round seed), so the
plan is the same whatever it is stacked with. Clients of unequal size do
unequal numbers of steps: the stack runs the longest plan and masks the others
(their parameters and optimiser state stand still), and a short last batch is
padded with masked rows. The loss of each client is the mean over its real rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F

from hetfed.config import OptimizerConfig, TrainConfig
from hetfed.engine import optim
from hetfed.engine.types import ClientData
from hetfed.models.base import Model, Noise, Params

#: An extra loss term per client ``[n]``, e.g. FedProx's proximal term.
Regulariser = Callable[[Params], torch.Tensor]
#: each client's training loss ``[n]`` of stacked params on a batch ``(x, y, row mask, noise)`` (default: the
#: model's cross-entropy, averaged over the client's real rows), or ``(objective, reported)`` when the loss
#: the client reports differs from the one it descends (APFL reports f(w), Per-FedAvg the meta-loss)
Objective = Callable[[Params, torch.Tensor, torch.Tensor, torch.Tensor, Noise], torch.Tensor]
#: a map applied to the trained parameters after every step (a constraint: APFL keeps α in [0, 1])
Projection = Callable[[Params], Params]


def cross_entropy(model: Model, params: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor,
                  noise: Noise | None = None) -> torch.Tensor:
    """Each client's mean cross-entropy ``[n]`` over its real rows (``mask`` [n, batch]: 1 real, 0 padding)."""
    logits = model.forward(params, xb, noise)
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yb.reshape(-1), reduction="none").view(yb.shape)
    return (ce * mask).sum(1) / mask.sum(1).clamp(min=1)


@dataclass(frozen=True)
class LocalSchedule:
    """How much local work: epochs E or steps τ, batch size B."""

    batch_size: int
    epochs: float | None = 1.0
    steps: int | None = None
    cap_one_pass: bool = False

    @classmethod
    def from_train(cls, cfg: TrainConfig) -> LocalSchedule:
        return cls(cfg.batch_size, cfg.local_epochs, cfg.local_steps, cfg.steps_cap_one_pass)

    def n_steps(self, n: int) -> int:
        per_epoch = max(1, math.ceil(n / self.batch_size))
        if self.steps is not None:
            return min(self.steps, per_epoch) if self.cap_one_pass else self.steps
        return max(1, round((self.epochs or 1.0) * per_epoch))


def plan_batches(n: int, schedule: LocalSchedule, rng: np.random.Generator) -> list[np.ndarray]:
    """Positions (0..n−1) of each step's batch: epochs of shuffled, ≤ B-sized batches."""
    if n == 0:
        return []
    steps = schedule.n_steps(n)
    batches: list[np.ndarray] = []
    while len(batches) < steps:
        perm = rng.permutation(n)
        batches.extend(perm[i : i + schedule.batch_size] for i in range(0, n, schedule.batch_size))
    return batches[:steps]


def _plan_tensors(data: ClientData, schedule: LocalSchedule,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
    """Pool indices [n, S, B], row masks [n, S, B], and rows per client per step."""
    plans = []
    for idx, seed in zip(data.indices, data.seeds, strict=True):
        rng = np.random.default_rng(seed)
        plans.append([idx[b] for b in plan_batches(len(idx), schedule, rng)])
    n, steps, b = len(plans), max((len(p) for p in plans), default=0), schedule.batch_size
    index = np.zeros((n, steps, b), dtype=np.int64)
    rows = np.zeros((n, steps), dtype=np.int64)
    for k, plan in enumerate(plans):
        for t, batch in enumerate(plan):
            index[k, t, : len(batch)] = batch
            rows[k, t] = len(batch)
    mask = np.arange(b)[None, None, :] < rows[:, :, None]
    return (
        torch.as_tensor(index, device=device),
        torch.as_tensor(mask, dtype=torch.float32, device=device),
        rows,
    )


def train_stack(
    model: Model,
    params: Params,
    data: ClientData,
    schedule: LocalSchedule,
    opt_cfg: OptimizerConfig,
    lr: float,
    opt_state: Params | None = None,
    regulariser: Regulariser | None = None,
    trainable: list[str] | None = None,
    objective: Objective | None = None,
    project: Projection | None = None,
) -> tuple[Params, Params, torch.Tensor]:
    """Train stacked ``params`` on each client's data; returns (params, opt state, mean loss).

    ``trainable`` names the parameters that move (default: all of ``params``);
    the others are inputs held fixed (e.g. a frozen global model in a mixture).
    ``objective`` replaces the model's cross-entropy per row (APFL trains two models on
    one batch); ``project`` constrains the parameters after every step.
    """
    device = data.x.device
    buffers = set(model.buffer_names)  # updated by the forward, never by a gradient
    names = [k for k in (trainable if trainable is not None else list(params)) if k not in buffers]
    fixed = {k: v for k, v in params.items() if k not in names}
    # own copies: the optimiser updates in place, the caller's tensors stay untouched
    current = {k: params[k].detach().clone(memory_format=torch.contiguous_format) for k in names}
    state = {k: v.clone() for k, v in opt_state.items()} if opt_state is not None else optim.init_state(opt_cfg, current)
    index, mask, rows = _plan_tensors(data, schedule, device)
    n, steps = index.shape[0], index.shape[1]
    gens = [torch.Generator().manual_seed(int(s) ^ 0x5EED) for s in data.seeds]
    loss_sum = torch.zeros(n, device=device)
    for t in range(steps):
        width = int(rows[:, t].max())  # trim the padding no client needs at this step
        if width == 0:
            break
        active_np = rows[:, t] > 0
        active = torch.as_tensor(active_np, device=device)
        idx_t, m_t = index[:, t, :width], mask[:, t, :width]
        xb, yb = data.x[idx_t], data.y[idx_t]
        noise = Noise(gens, active_np.tolist(), rows[:, t].tolist(), device)
        leaves = {k: v.detach().requires_grad_(True) for k, v in current.items()}
        out = (objective or partial(cross_entropy, model))({**fixed, **leaves}, xb, yb, m_t, noise)
        per_client, reported = out if isinstance(out, tuple) else (out, out)
        total = per_client
        if regulariser is not None:
            total = total + regulariser({**fixed, **leaves})
        grads = torch.autograd.grad(total.sum(), list(leaves.values()))
        with torch.no_grad():
            current = {k: v.detach() for k, v in leaves.items()}
            optim.step(opt_cfg, current, dict(zip(leaves, grads, strict=True)), state, lr, active)
            if project is not None:
                current = project(current)
            for k, values in noise.updates.items():  # buffers: each active client's new value
                if k in fixed:
                    fixed[k] = torch.stack([v.to(fixed[k].dtype) if v is not None and on else fixed[k][i]
                                            for i, (v, on) in enumerate(zip(values, active_np, strict=True))])
            loss_sum += reported.detach() * active
    n_steps = torch.as_tensor((rows > 0).sum(1), device=device).clamp(min=1)
    trained = {**fixed, **{k: v.detach() for k, v in current.items()}}
    return trained, state, loss_sum / n_steps


def stack_blocks(steps: Sequence[int], cap: int, per_step: float) -> list[list[int]]:
    """Which clients train together: positions into ``steps`` (each client's planned local steps), grouped so a
    stack's clients run similar numbers of steps, each stack at most ``cap`` clients.

    A stack runs for its longest client's steps, and the clients that finished still compute (masked) until
    then; on unequal clients (a Dirichlet split: 62 … 6 415 samples) one stack computes ~2.5× the real
    client-steps. Each stack also pays a fixed cost per step (``per_step``, in client-steps: Python, kernel
    launches). The stacks minimise Σ (clients + per_step) × longest steps over runs of the clients sorted by
    steps (a dynamic programme; above :data:`EXACT_UP_TO` clients, over runs of equal step counts, each run
    cut in ``cap``-sized stacks); within a stack clients keep their order. Equal plans give the id-order
    ``cap``-sized stacks of before.
    """
    n = len(steps)
    if n == 0:
        return []
    order = sorted(range(n), key=lambda i: (steps[i], i))
    if len(set(steps)) == 1:
        return [sorted(order[i:i + cap]) for i in range(0, n, cap)]
    s = np.asarray([steps[i] for i in order], dtype=np.float64)
    if n <= EXACT_UP_TO:
        starts = np.arange(n + 1)
    else:  # breakpoints only where the step count changes; a run longer than cap is cut in stacks of cap
        starts = np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1], [True]]))
    best = np.full(len(starts), np.inf)
    best[0] = 0.0
    cut = np.zeros(len(starts), dtype=np.int64)
    for j in range(1, len(starts)):
        lo = 0 if n > EXACT_UP_TO else max(0, j - cap)
        size = starts[j] - starts[lo:j]
        cost = best[lo:j] + (size + np.ceil(size / cap) * per_step) * s[starts[j] - 1]
        k = int(np.argmin(cost))
        cut[j], best[j] = lo + k, cost[k]
    bounds = []
    j = len(starts) - 1
    while j > 0:
        bounds.append((int(starts[cut[j]]), int(starts[j])))
        j = int(cut[j])
    blocks: list[list[int]] = []
    for lo_, hi in reversed(bounds):
        members = order[lo_:hi]
        blocks += [sorted(members[k:k + cap]) for k in range(0, len(members), cap)]
    return blocks


#: rounds of at most this many clients get the exact programme (O(clients × cap)); larger ones the one over
#: runs of equal step counts
EXACT_UP_TO = 4096


def stack_occupancy(steps: Sequence[int], blocks: Sequence[Sequence[int]]) -> float:
    """The real client-steps ÷ the client-steps the stacks compute (1: no client waits on a longer one)."""
    computed = sum(len(b) * max(steps[i] for i in b) for b in blocks)
    return float(sum(steps)) / computed if computed else 1.0
