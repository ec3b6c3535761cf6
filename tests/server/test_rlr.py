"""The robust learning rate (``server.combine.rule: rlr``) against the authors' code written out, and what it does to
a coordinate a minority pushes (the executors agreeing under a backdoor with it: test_backdoors_and_their_defences)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.engine.types import Upload
from hetfed.server.combine import parse


def _authors(glob: np.ndarray, updates: list[np.ndarray], sizes: list[float], threshold: int) -> np.ndarray:
    """``compute_robustLR`` and ``agg_avg`` of the authors' code, then ``cur + lr_vector * aggregated`` (server_lr 1),
    on flat vectors, one agent at a time."""
    sm_of_signs = np.abs(sum(np.sign(u) for u in updates))
    lr = np.where(sm_of_signs < threshold, -1.0, 1.0)
    sm_updates, total = 0.0, 0.0
    for u, n in zip(updates, sizes, strict=True):
        sm_updates = sm_updates + n * u
        total += n
    return glob + lr * (sm_updates / total)


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 12), st.integers(1, 8), st.integers(1, 6), st.booleans())
def test_the_rule_is_the_authors_code(seed, n, d, threshold, still):
    rng = np.random.default_rng(seed)
    glob = rng.normal(size=d + 2)
    updates = [rng.normal(size=d + 2) for _ in range(n)]
    if still:  # a coordinate no client moved: its sign 0
        for u in updates:
            u[0] = 0.0
    sizes = rng.integers(1, 50, size=n).astype(float)
    old = {"w": torch.as_tensor(glob[:d]), "b": torch.as_tensor(glob[d:])}
    up = Upload(list(range(n)), {"w": torch.as_tensor(np.stack(updates)[:, :d] + glob[:d]),
                                 "b": torch.as_tensor(np.stack(updates)[:, d:] + glob[d:])}, torch.as_tensor(sizes))
    rule, params = parse({"rule": "rlr", "threshold": threshold})
    out = rule.combine(old, up, params)
    np.testing.assert_allclose(np.concatenate([out["w"].numpy(), out["b"].numpy()]),
                               _authors(glob, updates, list(sizes), threshold), rtol=1e-10, atol=1e-12)


def test_a_coordinate_a_minority_pushes_moves_back_and_one_all_agree_on_moves_as_the_mean():
    # 5 clients: coordinate 0 all move +1; coordinate 1 one client moves +10, the others not at all
    rows = torch.tensor([[1.0, 10.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    up = Upload(list(range(5)), {"w": rows}, torch.ones(5))
    rule, params = parse({"rule": "rlr", "threshold": 2})
    out = rule.combine({"w": torch.zeros(2, dtype=torch.float64)}, up, params)["w"]
    assert out.tolist() == pytest.approx([1.0, -2.0])  # the mean's +2 on coordinate 1 turned around

