"""Γ of a real federation from the clients' summaries (#26, part 1): equal to Γ computed on the pooled data
(the definition, hetfed.heterogeneity.gamma_reference), its DP release, and the parametric Γ_IID."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.gamma_summaries import (
    gamma_from_summaries,
    gamma_iid_from_summaries,
    privatise,
    summarise,
    summary_epsilon,
)
from hetfed.heterogeneity import gamma, gamma_iid, gamma_reference


@given(sizes=st.lists(st.integers(1, 40), min_size=2, max_size=6), d=st.integers(1, 6),
       shift=st.floats(0, 50), seed=st.integers(0, 10_000))
@settings(max_examples=60, deadline=None)
def test_gamma_from_summaries_equals_gamma_on_the_pooled_data(sizes, d, shift, seed):
    rng = np.random.default_rng(seed)
    xs = [rng.normal(shift + k, 1 + k % 3, size=(n, d)) for k, n in enumerate(sizes)]
    x = np.concatenate(xs)
    clients = np.split(np.arange(len(x)), np.cumsum(sizes)[:-1])
    expected = gamma_reference(x, clients)
    got = gamma_from_summaries([summarise(c) for c in xs])
    assert got == pytest.approx(expected, rel=1e-6, abs=1e-8 * max(1.0, shift**2))


def test_on_a_real_federation_it_is_the_gamma_a_run_reports():
    from hetfed.config import build_config
    from hetfed.pipeline import prepare

    prep = prepare(build_config({}), progress=False)
    fed = prep.federation
    summaries = [summarise(fed.x[idx]) for idx in fed.train]
    assert gamma_from_summaries(summaries) == pytest.approx(prep.heterogeneity.gamma, rel=1e-7)  # float64 round-off
    assert gamma(fed.x, list(fed.train)) == pytest.approx(prep.heterogeneity.gamma, rel=1e-12)


def test_noise_free_release_changes_nothing_and_noise_is_symmetric_and_accounted():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(50, 4))
    s = summarise(x, clip=1.0)
    assert np.linalg.norm(s.total) <= 50 + 1e-9  # every row clipped to norm ≤ 1
    same = privatise(s, 1.0, 0.0, rng)
    assert same.n == s.n and np.array_equal(same.total, s.total) and np.array_equal(same.outer, s.outer)
    noisy = privatise(s, 1.0, 2.0, rng)
    assert np.allclose(noisy.outer, noisy.outer.T) and not np.allclose(noisy.outer, s.outer)
    delta = 1e-5
    eps = [summary_epsilon(sigma, delta) for sigma in (0.5, 1.0, 2.0, 8.0)]
    assert all(a > b for a, b in zip(eps, eps[1:], strict=False))  # more noise, less privacy loss
    for sigma, e in zip((0.5, 1.0, 2.0, 8.0), eps, strict=True):
        # one Gaussian mechanism: RDP α/(2σ²), converted with ε = min_α α/(2σ²) + ln(1/δ)/(α − 1)
        alphas = np.linspace(1.01, 500, 50_000)
        classic = float(np.min(alphas / (2 * sigma**2) + np.log(1 / delta) / (alphas - 1)))
        assert 0 < e <= classic + 1e-6


def test_the_parametric_iid_reference_matches_the_datas_on_gaussian_clients():
    rng = np.random.default_rng(1)
    sizes = [30, 60, 120, 240, 45, 90]
    x = rng.multivariate_normal(np.zeros(5), np.diag([1.0, 2.0, 0.5, 1.5, 1.0]), size=sum(sizes))
    clients = np.split(np.arange(len(x)), np.cumsum(sizes)[:-1])
    data_ref, _ = gamma_iid(x, clients, draws=30, seed=0)
    summaries = [summarise(x[c]) for c in clients]
    param_ref, sd = gamma_iid_from_summaries(summaries, draws=30, seed=0)
    assert param_ref == pytest.approx(data_ref, rel=0.15)
    assert sd > 0


def test_the_parametric_reference_takes_a_feature_constant_on_every_client():
    """A pixel that is 0 on every client (digits' blank corner; every exported digits node has it) makes the pooled
    covariance singular: scipy's Wishart refused it (LinAlgError, the deployment's ServerApp failed). Its draws are
    the singular Wishart's: the constant feature adds nothing, so the reference is the one without it."""
    rng = np.random.default_rng(2)
    sizes = [30, 60, 120, 240]
    x = rng.multivariate_normal(np.zeros(4), np.diag([1.0, 2.0, 0.5, 1.5]), size=sum(sizes))
    clients = np.split(np.arange(len(x)), np.cumsum(sizes)[:-1])
    padded = np.column_stack([x, np.zeros(len(x))])  # the constant feature
    ref, sd = gamma_iid_from_summaries([summarise(padded[c]) for c in clients], draws=30, seed=0)
    plain, _ = gamma_iid_from_summaries([summarise(x[c]) for c in clients], draws=30, seed=0)
    assert np.isfinite(ref) and sd > 0
    assert ref == pytest.approx(plain, rel=0.2)  # other draws of the same reference


def test_noised_summaries_need_a_clip_and_report_their_epsilon(capsys):
    from hetfed.cli import main
    from hetfed.config import FlowerConfig
    from hetfed.flower.executor import FlowerExecutor
    from hetfed.gamma_summaries import summarise, summary_epsilon

    assert main(["config", "--set", "flower.summary_noise=1.0"]) == 2
    err = capsys.readouterr().err
    assert "flower.summary_noise = 1.0 is not allowed without flower.summary_clip" in err
    assert len(err.strip().splitlines()) == 1
    ex = FlowerExecutor.__new__(FlowerExecutor)  # only its Γ bookkeeping, no grid
    ex.flower, ex.measured_on = FlowerConfig(summary_noise=2.0, summary_clip=5.0), "train"
    rng = np.random.default_rng(0)
    got = ex._gamma({k: summarise(rng.normal(k, 1, (50, 3)), 5.0) for k in range(3)})
    assert got["epsilon"] == pytest.approx(summary_epsilon(2.0, 1e-5)) and got["delta"] == 1e-5
    assert got["clip"] == 5.0 and got["noise_multiplier"] == 2.0 and got["clients"] == 3


def test_a_nodes_summary_noise_is_not_the_servers_to_redraw():
    """The server sends the run's seed in the config, so noise drawn from that seed could be redrawn and
    subtracted by the very party the (ε, δ) protects against. Noise keyed by anything the server knows (config,
    seed, client id) would repeat: a node's noise comes from its own entropy, so two releases differ."""
    pytest.importorskip("flwr")
    from flwr.app import ConfigRecord, RecordDict

    from hetfed.config import build_config, dump_config
    from hetfed.flower.client_app import summary_step
    from hetfed.flower.node import node_side
    from hetfed.flower.records import records_to_summaries

    cfg = build_config({"partition": {"clients": 3}})
    side = node_side(ConfigRecord({"config": dump_config(cfg), "method": 0}))
    request = ConfigRecord({"on": "train", "clip": 5.0, "noise": 1.0})
    first, second = (records_to_summaries(RecordDict(summary_step(side, [0, 1], request))) for _ in range(2))
    clean = [summarise(np.asarray(side.fed.x)[side.fed.measured_rows(k, "train")], 5.0) for k in (0, 1)]
    for a, b, s in zip(first, second, clean, strict=True):
        assert not np.allclose(a.total, b.total) and not np.allclose(a.total, s.total)
