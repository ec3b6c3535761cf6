"""Fang et al.'s full-knowledge Trim attack (``attack.kind: fang_trim``): each malicious client's update against the
attack's released code (``full_trim``) written out, each client its own draws whatever the round's chunks, every
coordinate past the honest extreme against the honest direction, and the executors agreeing under it."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.config import AttackConfig
from hetfed.engine.faults import Adversary, _name_seed
from hetfed.engine.rng import ATTACKERS, torch_gen
from hetfed.executors.inprocess import SequentialExecutor, VectorisedExecutor
from hetfed.executors.simulate import simulate
from tests.server.test_colluding_attacks_and_defences import _round
from tests.server.test_robust import _algo, _fed


def _full_trim(v: torch.Tensor, random_12: list[torch.Tensor]) -> list[torch.Tensor]:
    """``full_trim`` of the code released with the attack (on the rows ``v`` it reads; ``random_12`` the factors
    in [1, 2) of each malicious client), line for line."""
    maximum_dim = torch.max(v, 0).values
    minimum_dim = torch.min(v, 0).values
    direction = torch.sign(torch.sum(v, 0))
    directed_dim = (direction > 0) * minimum_dim + (direction < 0) * maximum_dim
    return [directed_dim * ((direction * directed_dim > 0) / r + (direction * directed_dim < 0) * r)
            for r in random_12]


def _draws(seed: int, rnd: int, client: int, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.rand(shape, generator=torch_gen(seed, ATTACKERS, rnd, client, _name_seed("w"), 1),
                      dtype=torch.float64)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), cuts=st.lists(st.integers(1, 11), min_size=0, max_size=3),
       fraction=st.sampled_from([0.1, 0.25, 0.4]))
def test_each_malicious_client_sends_the_codes_update_with_its_own_draws_however_the_round_is_chunked(
        seed, cuts, fraction):
    fed = _fed(clients=12)
    adv = Adversary(AttackConfig(kind="fang_trim", fraction=fraction), fed, seed=seed % 5, n_classes=fed.n_classes)
    rng = np.random.default_rng(seed)
    ref = torch.as_tensor(rng.normal(size=(3, 4)))
    thetas = ref.numpy() + rng.normal(size=(12, 3, 4)) * rng.uniform(0.01, 5) + rng.normal(size=(3, 4))
    order = list(rng.permutation(12))
    bounds = sorted(set(cuts))
    chunks = [order[a:b] for a, b in zip([0, *bounds], [*bounds, 12], strict=True) if a < b]
    out = _round(adv, ref, thetas, chunks)
    bad = [int(k) for k in np.flatnonzero(adv.malicious)]
    honest = torch.as_tensor(thetas[~adv.malicious] - ref.numpy())
    expected = _full_trim(honest, [1 + _draws(seed % 5, 0, k, (3, 4)) for k in bad])
    sent = dict(zip(out.client_ids, out.params["w"], strict=True))
    for k, crafted in zip(bad, expected, strict=True):
        torch.testing.assert_close(sent[k], ref + crafted, rtol=1e-12, atol=1e-12)
    for k in set(range(12)) - set(bad):
        torch.testing.assert_close(sent[k], torch.as_tensor(thetas[k]), rtol=0, atol=0)
    if len(bad) > 1:
        assert not torch.equal(sent[bad[0]], sent[bad[1]])  # each its own update


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), honest=st.integers(1, 10), b=st.floats(1.5, 5.0))
def test_every_coordinate_goes_past_the_honest_extreme_against_the_honest_direction(seed, honest, b):
    from hetfed.engine.attacks import Honest
    from hetfed.engine.attacks.fang_trim import FangTrimParams, fang_trim

    rng = np.random.default_rng(seed)
    rows = torch.as_tensor(rng.normal(size=(honest, 30)) + rng.normal(size=30))
    u = torch.as_tensor(rng.random(size=(3, 30)))
    view = Honest({"w": rows.mean(0)}, {"w": torch.zeros(30)}, {"w": rows}, honest + 3, 3, lambda name: u)
    crafted = fang_trim(view, FangTrimParams(b=b))["w"]
    direction = torch.sign(rows.sum(0))
    up, down = direction > 0, direction < 0
    assert (crafted[:, up] <= rows[:, up].min(0).values + 1e-12).all()  # the honest updates go up: it goes below
    assert (crafted[:, down] >= rows[:, down].max(0).values - 1e-12).all()
    extreme = torch.where(up, rows.min(0).values, rows.max(0).values)
    ratio = crafted / torch.where(extreme == 0, torch.ones_like(extreme), extreme)
    factor = 1 + (b - 1) * u
    assert torch.allclose(torch.where(extreme * direction > 0, 1 / ratio, ratio)[:, extreme != 0],
                          factor[:, extreme != 0], rtol=1e-9)


@pytest.mark.parametrize("combine", [{"rule": "trimmed_mean", "fraction": 0.3}, {"rule": "median"}])
def test_executors_agree_under_the_trim_attack(combine):
    fed = _fed()
    results = []
    for executor in (VectorisedExecutor(), SequentialExecutor()):
        algo, cfg = _algo(fed, combine=combine, client_dropout=0.2)
        results.append(simulate(algo, fed, cfg, seed=1, executor=executor,
                                attack=AttackConfig(kind="fang_trim", fraction=0.3)))
    a, b = results
    for k in a.server.params:
        torch.testing.assert_close(a.server.params[k], b.server.params[k], rtol=1e-5, atol=1e-6)
    assert a.faults == b.faults
