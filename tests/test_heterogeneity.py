import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.linalg import sqrtm

from hetfed.heterogeneity import (
    frechet_distance,
    gamma,
    gamma_reference,
    js_divergence,
    label_emd,
    measure,
)


def _spd(rng, d, rank=None):
    a = rng.normal(size=(d, rank or d))
    return a @ a.T + (1e-3 * np.eye(d) if rank is None else 0)


def test_identical_gaussians_have_zero_distance():
    rng = np.random.default_rng(1)
    mu, s = rng.normal(size=6), _spd(rng, 6)
    assert frechet_distance(mu, s, mu, s) == pytest.approx(0, abs=1e-8)


def test_diagonal_covariances_match_closed_form():
    rng = np.random.default_rng(2)
    mu1, mu2 = rng.normal(size=5), rng.normal(size=5)
    v1, v2 = rng.uniform(0.1, 3, 5), rng.uniform(0.1, 3, 5)
    expected = np.sum((mu1 - mu2) ** 2) + np.sum((np.sqrt(v1) - np.sqrt(v2)) ** 2)
    assert frechet_distance(mu1, np.diag(v1), mu2, np.diag(v2)) == pytest.approx(expected, rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 8), st.integers(0, 10_000))
def test_random_spd_matches_scipy_sqrtm(d, seed):
    rng = np.random.default_rng(seed)
    mu1, mu2, s1, s2 = rng.normal(size=d), rng.normal(size=d), _spd(rng, d), _spd(rng, d)
    ref = np.sum((mu1 - mu2) ** 2) + np.trace(s1 + s2 - 2 * np.real(sqrtm(s1 @ s2)))
    assert frechet_distance(mu1, s1, mu2, s2) == pytest.approx(ref, rel=1e-6, abs=1e-8)


def test_singular_covariances_are_finite_and_nonnegative():
    rng = np.random.default_rng(3)
    s1, s2 = _spd(rng, 10, rank=2), _spd(rng, 10, rank=3)
    value = frechet_distance(np.zeros(10), s1, np.ones(10), s2)
    assert np.isfinite(value) and value >= 0
    assert frechet_distance(np.zeros(4), np.zeros((4, 4)), np.zeros(4), np.zeros((4, 4))) == 0


def test_gamma_is_zero_for_identical_clients_and_grows_with_separation():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(400, 3))
    same = [np.arange(0, 400, 2), np.arange(1, 400, 2)]
    x2 = x.copy()
    x2[200:] += 5
    split = [np.arange(200), np.arange(200, 400)]
    assert gamma(x, same) < 0.1
    assert gamma(x2, split) > 20


def test_label_skew_figures():
    counts = np.array([[10, 0], [0, 10]])
    assert label_emd(counts).tolist() == [1.0, 1.0]
    assert js_divergence([0.5, 0.5], [0.5, 0.5]) == 0
    assert js_divergence([1, 0], [0, 1]) == pytest.approx(1.0)
    y = np.array([0] * 10 + [1] * 10)
    m = measure(np.zeros((20, 2)), y, [np.arange(10), np.arange(10, 20)], 2)
    assert m.label_emd_mean == 1.0 and m.class_counts == [[10, 0], [0, 10]]


@settings(max_examples=15, deadline=None)
@given(st.integers(2, 6), st.integers(2, 20), st.integers(0, 1000))
def test_fast_gamma_matches_the_definition(k, d, seed):
    """Sufficient statistics + low-rank factors give the same Γ as the direct formula."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(120, d)) * rng.uniform(0.1, 3, d) + rng.normal(size=d)
    cuts = np.sort(rng.choice(np.arange(1, 120), k - 1, replace=False))
    clients = np.split(rng.permutation(120), cuts)
    assert gamma(x, clients) == pytest.approx(gamma_reference(x, clients), rel=1e-6, abs=1e-8)
