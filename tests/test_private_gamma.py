"""#45: Γ of a real federation from noised summaries is an estimate a user can trust, or says it is not.

Before: on digits, Dirichlet 0.1 (clients of 15–250 rows), σ = 2 and clip 1 gave Γ = 0 in every release (every
client distance clamped to 0 on indefinite covariances; clean Γ 0.171), σ = 2 and clip 8 gave ~10³⁰ (negative
noised counts), and σ = 0.05, clip 1 gave −53%, each reported with its ε and no caveat."""

from __future__ import annotations

import numpy as np
import pytest

from hetfed import gamma_summaries as gs


def _digits_clients():
    from hetfed.config import build_config
    from hetfed.pipeline import build_federation

    fed = build_federation(build_config({"partition": {"kind": "dirichlet", "alpha": 0.1, "min_size": 0}}),
                           progress=False).federation
    return [fed.x[fed.measured_rows(k, "train")] for k in range(fed.n_clients)]


@pytest.mark.parametrize("sigma,clip", [(2.0, 1.0), (2.0, 8.0), (0.05, 1.0)])
def test_the_issues_releases_are_finite_and_positive_and_warned_about(sigma, clip):
    clients = _digits_clients()
    clean = [gs.summarise(x, clip) for x in clients]
    rng = np.random.default_rng(0)
    report = gs.private_gamma_report([gs.privatise(s, clip, sigma, rng) for s in clean], clip, sigma)
    assert 0 < report["gamma_released"] < 1e6 and 0 <= report["gamma_low"] <= report["gamma_high"] < 1e6
    assert report["gamma"] < report["gamma_released"]  # the noise inflates Γ here; the estimate removes the shift
    # clients of 15–250 rows: the noise dominates at each of these settings, and the report says so
    assert report["clients_below_min_size"] == len(clients) and report["min_client_size"] > 250
    assert "dominated by the noise" in report["warning"] and f"fewer than {report['min_client_size']}" in \
        report["warning"]


def test_a_released_summary_has_a_count_of_at_least_two_and_a_psd_covariance():
    rng = np.random.default_rng(3)
    s = gs.privatise(gs.summarise(rng.normal(size=(3, 6)), 1.0), 1.0, 4.0, rng)
    r = gs.released(s)
    mu, cov = r.moments()
    assert r.n >= 2 and np.linalg.eigvalsh(cov).min() >= -1e-12 and np.allclose(mu, s.total / r.n)


def test_each_part_is_noised_at_its_own_scale_with_sensitivity_root_three():
    """(n, Σx/C, Σxxᵀ/C²) changes by ≤ √3 per record: the count's noise no longer grows with C²."""
    assert gs.noise_stds(8.0, 2.0) == pytest.approx((2 * 3**0.5, 16 * 3**0.5, 128 * 3**0.5))
    x = np.random.default_rng(0).normal(size=(1, 7)) * 100
    one = gs.summarise(x, 8.0)
    scaled = np.concatenate([[one.n], one.total / 8.0, one.outer[np.triu_indices(7)] / 64.0])
    assert np.linalg.norm(scaled) <= gs.SENSITIVITY + 1e-9


@pytest.mark.slow
def test_the_interval_covers_the_noise_free_gamma_in_90_percent_of_100_releases_above_the_size_it_names():
    """Six Gaussian clients of 2 000 five-dimensional rows, σ = 1, clip 2: the basic-bootstrap 95% interval holds
    the noise-free Γ in ≥ 90% of 100 independent releases; the clients are above the size the report names."""
    rng0 = np.random.default_rng(0)
    clients = [rng0.normal(k * 0.3, 1 + 0.1 * k, size=(2000, 5)) * 0.3 for k in range(6)]
    clean = [gs.summarise(x, 2.0) for x in clients]
    truth = gs.gamma_from_summaries(clean)
    rng = np.random.default_rng(1)
    hits, below = 0, 0
    for i in range(100):
        pg = gs.private_gamma([gs.privatise(s, 2.0, 1.0, rng) for s in clean], 2.0, 1.0, seed=i)
        hits += pg.low <= truth <= pg.high
        below += pg.clients_below
    assert hits >= 90 and below == 0, (hits, below)
