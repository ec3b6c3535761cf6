"""Fang et al.'s full-knowledge Krum attack (``attack.kind: fang_krum``): the bound on λ against the paper's formula
written out one client at a time, the crafted update chosen by hetfed's own Krum rule with λ as large as it still is,
the other malicious clients' noise, and Krum choosing the attackers in a run (what its defence decided says so)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.config import AttackConfig
from hetfed.engine.attacks.fang_krum import crafted_lambda, krum_chooses, lambda_bound
from hetfed.engine.faults import Adversary
from hetfed.server.combine import parse
from tests.server.test_colluding_attacks_and_defences import _round
from tests.server.test_defence_decisions import _decisions
from tests.server.test_robust import _fed


def _paper_bound(rows: np.ndarray, c: int) -> float:  # m = h + c: the honest updates and the malicious
    """§4.2's bound, one honest client at a time: 1/((m − 2c − 1)√d) · min_i Σ over i's m − c − 2 nearest honest
    of the distances, + 1/√d · max_i ‖Δ_i‖."""
    h, d = rows.shape
    m = h + c
    sums = []
    for i in range(h):
        others = sorted(float(np.linalg.norm(rows[j] - rows[i])) for j in range(h) if j != i)
        sums.append(sum(others[: m - c - 2]))
    return min(sums) / ((m - 2 * c - 1) * math.sqrt(d)) + max(float(np.linalg.norm(r)) for r in rows) / math.sqrt(d)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.integers(6, 14), st.integers(1, 3), st.integers(2, 9))
def test_the_bound_is_the_papers_and_lambda_the_largest_krum_still_chooses(seed, h, c, d):
    rng = np.random.default_rng(seed)
    rows = rng.normal(size=(h, d)) * rng.uniform(0.01, 3) + rng.normal(size=d)
    t = torch.as_tensor(rows)
    assert lambda_bound(t, c, h + c) == pytest.approx(_paper_bound(rows, c), rel=1e-9)
    s = torch.sign(t.sum(0))
    lam = crafted_lambda(t, s, c, h + c, 1e-5)
    bound = lambda_bound(t, c, h + c)
    if lam > 0:
        assert krum_chooses(t, -lam * s, c)  # chosen …
        k = round(math.log2(bound / lam))
        assert lam == pytest.approx(bound / 2**k) and all(not krum_chooses(t, -bound / 2**j * s, c) for j in range(k))
    else:  # … or given up: no halving down to the stop was chosen
        assert all(not krum_chooses(t, -bound / 2**j * s, c) for j in range(int(math.log2(bound / 1e-5)) + 1))


def test_hetfeds_krum_chooses_a_malicious_update_and_the_others_are_near_it():
    fed = _fed(clients=12)
    adv = Adversary(AttackConfig(kind="fang_krum", fraction=0.25), fed, seed=0, n_classes=fed.n_classes)
    bad = [int(k) for k in np.flatnonzero(adv.malicious)]
    rng = np.random.default_rng(4)
    ref = torch.as_tensor(rng.normal(size=(3, 4)))
    thetas = ref.numpy() + rng.normal(size=(12, 3, 4)) * 0.1 + rng.normal(size=(3, 4)) * 0.05
    out = _round(adv, ref, thetas, [list(range(12))])
    rule, params = parse({"rule": "krum", "byzantine_fraction": 0.25})
    chosen = out.client_ids[int(rule.combine({"w": ref}, out, params).weights.argmax())]
    assert chosen in bad
    sent = dict(zip(out.client_ids, out.params["w"], strict=True))
    honest = torch.as_tensor(thetas[~adv.malicious] - ref.numpy()).reshape(9, -1)
    s = torch.sign(honest.sum(0))
    first = (sent[bad[0]] - ref).reshape(-1)
    lam = crafted_lambda(honest, s, len(bad), 12, 1e-5)
    assert lam > 0
    torch.testing.assert_close(first, -lam * s, rtol=0, atol=1e-14)  # the first sends −λ·s itself
    for k in bad[1:]:  # the others within ±1e-5/d of it, not equal
        gap = (sent[k] - ref).reshape(-1) - first
        assert 0 < float(gap.abs().max()) <= 1e-5 / 12


def test_krum_keeps_the_attackers_under_the_attack_made_against_it():
    """Under sign flipping Krum chooses an honest update every round; under Fang's Krum attack an attacker's, and
    what the defence decided says so (its weight on the malicious updates)."""
    flipped, _ = _decisions({"rule": "krum", "byzantine_fraction": 0.3}, AttackConfig(kind="sign_flip", fraction=0.3))
    assert all(row["attack_weight"] == 0.0 for row in flipped.values())
    fang, _ = _decisions({"rule": "krum", "byzantine_fraction": 0.3}, AttackConfig(kind="fang_krum", fraction=0.3))
    assert sum(row["attack_weight"] == 1.0 for row in fang.values()) >= 3, fang

