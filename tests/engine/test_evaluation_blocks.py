"""Scoring unequal clients in blocks of the least cost (#74 §5): on a CPU a block is padded to its widest client, and
each block is one more forward call; the blocks are cut where a call costs less than the padding it saves."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.config import build_config
from hetfed.engine import evaluate
from hetfed.engine.evaluate import call_rows, set_scores, size_blocks
from hetfed.models import build_model


def _cost(sizes: np.ndarray, blocks: list[np.ndarray], call: float) -> float:
    return sum(call + len(b) * float(sizes[b].max()) for b in blocks)


def _least_cost(sizes: np.ndarray, call: float) -> float:
    """Every cut of the size-sorted clients into contiguous blocks, the cheapest's cost (the reference)."""
    s = np.sort(sizes)
    best = float("inf")
    for cuts in itertools.product((False, True), repeat=len(s) - 1):
        total, start = 0.0, 0
        for j, cut in enumerate([*cuts, True]):
            if cut:
                total += call + (j + 1 - start) * float(s[j])
                start = j + 1
        best = min(best, total)
    return best


@settings(max_examples=150, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=8), st.floats(0.0, 500.0))
def test_the_blocks_are_the_cheapest_cut_of_the_size_sorted_clients(sizes, call):
    sizes = np.array(sizes, dtype=np.int64)
    blocks = size_blocks(sizes, call_rows=call)
    assert sorted(np.concatenate(blocks).tolist()) == list(range(len(sizes)))  # every client once
    assert [b for b in blocks if len(b)] == blocks
    widths = [(int(sizes[b].min()), int(sizes[b].max())) for b in blocks]
    assert all(a[1] <= b[0] for a, b in zip(widths, widths[1:], strict=False))  # contiguous runs of sizes
    assert _cost(sizes, blocks, call) == pytest.approx(_least_cost(sizes, call), rel=1e-12)


def _least_cost_quadratic(sizes: np.ndarray, call: float) -> float:
    """The same least cost by the plain programme over every last cut (the reference for larger federations)."""
    s = np.sort(sizes).astype(np.float64)
    best = np.zeros(len(s) + 1)
    for j in range(1, len(s) + 1):
        best[j] = np.min(best[:j] + call + s[j - 1] * (j - np.arange(j)))
    return float(best[-1])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 5000), min_size=1, max_size=400), st.floats(0.0, 3000.0))
def test_the_cheapest_cut_of_hundreds_of_clients_is_the_plain_programmes(sizes, call):
    sizes = np.array(sizes, dtype=np.int64)
    blocks = size_blocks(sizes, call_rows=call)
    assert sorted(np.concatenate(blocks).tolist()) == list(range(len(sizes)))
    assert _cost(sizes, blocks, call) == pytest.approx(_least_cost_quadratic(sizes, call), rel=1e-9)


def test_a_dear_row_pads_little_and_a_cheap_one_makes_few_calls():
    """PFLlib's CNN (a row of ~114 000 activation floats) cuts 40 sets of Dirichlet sizes finer than the padding bound
    did; a digits MLP (~600) keeps few wide blocks. On an accelerator the padding bound alone decides."""
    rng = np.random.default_rng(0)
    sizes = np.maximum(1, (rng.dirichlet(np.full(40, 0.3)) * 20_000).astype(np.int64))
    cnn4 = build_model(build_config({"model": {"kind": "cnn4"}}).model, (28, 28), 10)
    mlp = build_model(build_config({"model": {"kind": "mlp"}}).model, (64,), 10)
    cpu = torch.zeros(1)
    fine, coarse, bound = (size_blocks(sizes, call_rows=call_rows(cnn4, cpu)),
                           size_blocks(sizes, call_rows=call_rows(mlp, cpu)), size_blocks(sizes))
    padded = [sum(len(b) * int(sizes[b].max()) for b in blocks) for blocks in (fine, coarse, bound)]
    assert padded[0] < padded[2] and len(fine) > len(bound)
    assert len(coarse) <= len(fine) and padded[0] <= padded[1]
    assert call_rows(cnn4, torch.zeros(1, device="meta")) is None


def test_each_clients_scores_do_not_depend_on_its_block(monkeypatch):
    """The same sets scored in blocks of the least cost and in the padding-bound blocks: each client's correct
    count equal, its loss sum to float tolerance."""
    model = build_model(build_config({"model": {"kind": "mlp", "hidden": [16]}}).model, (6,), 3)
    gen = torch.Generator().manual_seed(0)
    n = 9
    params = {s.name: torch.stack([s.init(gen, s.shape) for _ in range(n)]) for s in model.specs()}
    x, y = torch.randn(2000, 6, generator=gen), torch.randint(0, 3, (2000,), generator=gen)
    rng = np.random.default_rng(1)
    sizes = [700, 3, 0, 90, 91, 1, 240, 12, 400]
    sets = [[rng.choice(2000, m, replace=False) for m in sizes], [rng.choice(2000, m // 3, replace=False)
                                                                 for m in sizes]]
    least = set_scores(model, params, x, y, sets)
    monkeypatch.setattr(evaluate, "CPU_CALL_FLOATS", 1e-9)  # a call costs nothing: a block per distinct size
    evaluate._INDEX_CACHE.clear()
    fine = set_scores(model, params, x, y, sets)
    assert least[1] == fine[1]
    assert least[0] == pytest.approx(fine[0], rel=1e-6)
    monkeypatch.setattr(evaluate, "CPU_CALL_FLOATS", 1e12)  # a call costs everything: one block
    evaluate._INDEX_CACHE.clear()
    whole = set_scores(model, params, x, y, sets)
    assert whole[1] == fine[1] and whole[0] == pytest.approx(fine[0], rel=1e-6)
