"""A round's batch plan for a stack of clients, built once before its first step: which pool rows each client reads
at each step, which rows are real, which clients still train — as device tensors, so the step loop reads them without a
host round-trip. What depends on the clients' sizes alone (:func:`_layout`) is kept for a run's next rounds."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Protocol

import numpy as np
import torch

from hetfed import streams
from hetfed.engine.types import ClientData, index_on


class Schedule(Hashable, Protocol):
    """What a plan reads of a client's local schedule (:class:`hetfed.engine.local.LocalSchedule`); hashable: the
    layouts a run's rounds reuse are kept by it."""

    @property
    def batch_size(self) -> int: ...

    def planned_steps(self, sizes: tuple[int, ...]) -> list[int]: ...

    def n_steps(self, n: int) -> int: ...


def plan_batches(n: int, schedule: Schedule, seed: int) -> list[np.ndarray]:
    """Positions (0..n−1) of each step's batch for one client of round seed ``seed``: epochs of shuffled,
    ≤ B-sized batches — what :func:`plan_steps` draws for it on the device (a host copy, for inspection)."""
    data = ClientData([0], torch.zeros(n, 1), torch.zeros(n), [np.arange(n)], [seed])
    plan = plan_steps(data, schedule, torch.device("cpu"))
    return [plan.index[0, t, : plan.rows[t][0]].numpy() for t in range(len(plan.rows)) if plan.rows[t][0]]


@dataclass(frozen=True)
class StepPlan:
    """A round's whole local plan for a stack, built once before its first step.

    The tensors live on the training device, so the step loop reads them without a host round-trip; the
    host lists say what the loop needs to know about shapes (the widest real batch of each step, whether
    every client still trains), computed from the clients' sizes alone.
    """

    index: torch.Tensor  # [n, S, B] pool indices (0 at padding)
    mask: torch.Tensor  # [n, S, B] 1.0 at a real row
    active: torch.Tensor  # [S, n] bool: the client trains at this step
    steps: torch.Tensor  # [n] float: each client's steps (≥ 1, the loss average's denominator)
    keys: torch.Tensor  # [n] int64: each client's round key (its dropout masks)
    rows: list[list[int]]  # per step: each client's real rows
    widths: list[int]  # per step: the widest real batch
    every: list[bool]  # per step: every client of the stack trains


@dataclass(frozen=True)
class _Layout:
    """What a round's plan takes from the clients' sizes and the schedule alone: the next round of a run (the same
    clients, or others of the same sizes) reuses it (:func:`_layout`). Read only."""

    epochs: list[int]
    rows: list[list[int]]
    widths: list[int]
    every: list[bool]
    real: torch.Tensor  # [n, S, B] bool
    flat: torch.Tensor  # [n, S, B] int64: the flat permutation position each row reads
    mask: torch.Tensor
    active: torch.Tensor
    steps: torch.Tensor
    first: torch.Tensor  # [n] each client's first position in the round's pool
    permutation: streams.PermutationLayout | None


def _layout(sizes: tuple[int, ...], schedule: Schedule, device: torch.device) -> _Layout:
    b = schedule.batch_size
    n_steps = schedule.planned_steps(sizes)
    per_epoch = [max(1, -(-m // b)) for m in sizes]
    epochs = [-(-s // e) for s, e in zip(n_steps, per_epoch, strict=True)]
    n, steps = len(sizes), max(n_steps, default=0)
    # host: real rows of each client at each step, from the sizes alone
    t = np.arange(steps)[None, :]
    size_h, pe_h = np.asarray(sizes)[:, None], np.asarray(per_epoch)[:, None]
    rows_h = np.where(t < np.asarray(n_steps)[:, None], np.clip(size_h - (t % pe_h) * b, 0, b), 0)
    # device: the positions, in each client's permutations' flat order
    dev = partial(torch.tensor, dtype=torch.int64, device=device)
    size, pe, block = (
        dev(list(sizes))[:, None, None],
        dev(per_epoch)[:, None, None],
        dev([m * e for m, e in zip(sizes, epochs, strict=True)]),
    )
    t_d, col = torch.arange(steps, device=device)[None, :, None], torch.arange(b, device=device)[None, None, :]
    pos = (t_d % pe) * b + col
    real = (t_d < dev(n_steps)[:, None, None]) & (pos < size)
    start = torch.cumsum(block, 0) - block
    flat = torch.where(real, start[:, None, None] + (t_d // pe) * size + pos, 0)
    trains = rows_h > 0
    return _Layout(
        epochs=epochs, rows=rows_h.T.tolist(), widths=[int(w) for w in rows_h.max(0)] if n else [],
        every=[bool(a) for a in np.all(trains, axis=0).tolist()] if n else [], real=real, flat=flat,
        mask=real.to(torch.float32), active=torch.as_tensor(trains.T, device=device),
        steps=torch.tensor(n_steps, dtype=torch.float32, device=device).clamp(min=1),
        first=dev(np.cumsum([0, *sizes[:-1]]).tolist() if n else []),
        permutation=streams.permutation_layout(sizes, epochs, device))


_layout_kept = lru_cache(maxsize=16)(_layout)
#: a layout of at most this many planned rows is kept for the next rounds (a larger round's plan is not worth the
#: memory: its steps cost more than building it)
KEEP_LAYOUT_UP_TO = 1 << 20


def plan_steps(data: ClientData, schedule: Schedule, device: torch.device) -> StepPlan:
    """Each client's batches for the round: epoch ``e`` of client ``k`` visits its samples in the order of a
    counter-based permutation keyed by its round seed (:func:`hetfed.streams.permutations`), cut into
    ≤ B-sized batches, epochs one after the other until its planned steps — for the whole stack at once. What
    depends on the clients' sizes alone is kept for the next rounds (:func:`_layout`); each round hashes its
    clients' keys, sorts their permutations and gathers their pool indices."""
    sizes = tuple(len(i) for i in data.indices)
    rows = sum(schedule.n_steps(m) * schedule.batch_size for m in sizes if m)
    layout = (_layout_kept if rows <= KEEP_LAYOUT_UP_TO else _layout)(sizes, schedule, torch.device(device))
    keys = streams.keys(data.seeds, device)
    perm = streams.permutations(keys, sizes, layout.epochs, layout.permutation)
    own = perm[layout.flat] if perm.numel() else torch.zeros_like(layout.flat)
    pool = index_on(np.concatenate(data.indices) if sizes else np.zeros(0, np.int64), device)
    index = torch.where(layout.real, pool[(layout.first[:, None, None] + own).clamp(max=max(len(pool) - 1, 0))], 0) \
        if len(pool) else own
    return StepPlan(index=index, mask=layout.mask, active=layout.active, steps=layout.steps, keys=keys,
                    rows=layout.rows, widths=layout.widths, every=layout.every)
