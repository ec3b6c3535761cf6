"""Which clients train together: a round's clients grouped into stacks of similar step counts (each stack runs
for its longest client's steps), and how much of what the stacks compute is real client-steps."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def computed_clients(training: int, n: int, recorded: bool) -> int:
    """How many of a longest-first stack of ``n`` a step computes when its first ``training`` still train: those, or,
    for a recorded step, the next power of two (at most ``n``) — a few shapes, each recorded once, serve the round."""
    return min(n, 1 << (training - 1).bit_length()) if recorded else training


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
    # beyond EXACT_UP_TO, breakpoints only where the step count changes; a run longer than cap is cut in stacks of cap
    starts = np.arange(n + 1) if n <= EXACT_UP_TO else np.flatnonzero(np.concatenate([[True], s[1:] != s[:-1], [True]]))
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


def longest_first_blocks(steps: Sequence[int], cap: int) -> list[list[int]]:
    """Positions into ``steps`` (each client's planned local steps) longest first, in stacks of ``cap``: the stacks of
    a plain step (:func:`hetfed.engine.local.train_stack` computes only a stack's clients that still train), whose cost
    is a fixed cost
    per step for its longest client's steps plus its clients' own steps — so as few stacks as memory allows, each of
    clients of similar length. Each stack is in the order its step computes (no reordering there)."""
    order = sorted(range(len(steps)), key=lambda i: -steps[i])
    return [order[i:i + cap] for i in range(0, len(order), cap)]


#: rounds of at most this many clients get the exact programme (O(clients × cap)); larger ones the one over
#: runs of equal step counts
EXACT_UP_TO = 4096


def stack_occupancy(steps: Sequence[int], blocks: Sequence[Sequence[int]], plain: bool = False,
                    recorded: bool = False) -> float:
    """The real client-steps ÷ the client-steps the stacks compute (1: no client waits on a longer one). ``plain``:
    the stacks' steps compute only the clients still training (:func:`computed_clients`; ``recorded``: replayed
    from recordings)."""
    computed = 0
    for b in blocks:
        longest = max(steps[i] for i in b)
        if plain:
            computed += sum(computed_clients(sum(1 for i in b if steps[i] > t), len(b), recorded)
                            for t in range(longest))
        else:
            computed += len(b) * longest
    return float(sum(steps)) / computed if computed else 1.0
