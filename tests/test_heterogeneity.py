import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.linalg import sqrtm

from hetfed.heterogeneity import (
    frechet_distance,
    gamma,
    gamma_reference,
    gaussian,
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


@settings(max_examples=25, deadline=None)
@given(st.integers(2, 5), st.integers(3, 12), st.integers(0, 3), st.booleans(), st.integers(0, 2**31 - 1))
def test_gamma_is_the_definitions_with_constant_and_collinear_features(k, d, constant, collinear, seed):
    """Features constant over the clients (digits' blank pixels) are left out of every distance, where they add
    nothing but a singular covariance; a client larger than the features is scored through the Cholesky factor of
    its others' covariance, or, where that is singular, through the eigendecomposition: Γ stays the definition's
    either way. A feature that is a copy of another makes every covariance singular, where any float64 method is
    off by ~√eps·‖Σ‖ (the square roots of zero eigenvalues computed as ±eps·‖Σ‖²), the definition's as well: 10⁻⁵
    there (the next test measures both against a 50-digit computation)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(150, d)) * rng.uniform(0.1, 3, d) + rng.normal(size=d)
    x[:, :constant] = 7.0
    if collinear:
        x[:, -1] = 2 * x[:, -2]
    cuts = np.sort(rng.choice(np.arange(1, 150), k - 1, replace=False))
    clients = np.split(rng.permutation(150), cuts)
    tolerance = {"rel": 1e-5} if collinear else {"rel": 1e-6, "abs": 1e-8}
    assert gamma(x, clients) == pytest.approx(gamma_reference(x, clients), **tolerance)
    assert gamma(np.full((10, 3), 2.0), np.array_split(np.arange(10), 2)) == 0.0  # nothing varies


def test_at_a_singular_covariance_gamma_is_within_float_rounding_of_its_exact_value():
    """The case hypothesis found at 10⁻⁶ from the definition's float64 value (3 features, the last twice the second;
    two clients of 89 and 61): its exact Γ, computed with 50 digits (mpmath: means, covariances and both
    eigendecompositions of the definition), is 0.315775047699762. hetfed's Γ (Cholesky factors) is 1.8e-7 from it;
    the definition's float64 value (eigendecompositions) 5.0e-7."""
    rng = np.random.default_rng(8)
    x = rng.normal(size=(150, 3)) * rng.uniform(0.1, 3, 3) + rng.normal(size=3)
    x[:, -1] = 2 * x[:, -2]
    cuts = np.sort(rng.choice(np.arange(1, 150), 1, replace=False))
    clients = np.split(rng.permutation(150), cuts)
    exact = 0.315775047699762
    assert abs(gamma(x, clients) - exact) < 3e-7 and abs(gamma_reference(x, clients) - exact) < 1e-6


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 16), st.lists(st.integers(0, 16), min_size=2, max_size=12), st.integers(0, 2**31 - 1))
def test_clients_no_larger_than_the_features_are_scored_together_as_the_definition_scores_each(d, sizes, seed):
    """Γ(x|y)'s classes and small clients go through one stacked computation (zero-padded rows, the factor form):
    each client's distance is still the definition's — its Gaussian against the others' pooled Gaussian —, empty
    and one-sample clients included; clients larger than the features are left to the one-at-a-time path, and the
    others of their set are still scored together."""
    from hetfed import heterogeneity as het

    rng = np.random.default_rng(seed)
    sizes = [min(n, d) for n in sizes]
    x = (rng.normal(size=(sum(sizes) + 30, d)) * rng.uniform(0.1, 3, d)).astype(np.float32)
    clients = [*np.split(rng.permutation(sum(sizes)), np.cumsum(sizes)[:-1]), np.arange(sum(sizes), len(x))]
    scored = clients[:-1]  # the last, larger than d, is only among the others
    p = het.pool(x, clients)
    together = het._batched_distances(p, scored) if max(sizes) else []
    flat = x.astype(np.float64)
    for k, idx in enumerate(scored if max(sizes) else []):
        alone = het._client_distance(p, idx)
        assert together[k] == pytest.approx(alone, rel=1e-6, abs=1e-7), (k, len(idx))
        if len(idx):  # an empty client has no Gaussian: both paths put its mean at the pool's
            others = np.concatenate([c for j, c in enumerate(clients) if j != k])
            assert together[k] == pytest.approx(frechet_distance(*gaussian(flat[idx]), *gaussian(flat[others])),
                                                rel=1e-6, abs=1e-7), (k, len(idx))
    # with a client larger than the features: that one alone, the others still together, each as alone
    every = het.client_distances(x, clients, pooled=p)
    assert every == pytest.approx([het._client_distance(p, idx) for idx in clients], rel=1e-6, abs=1e-7)


# ---------------------------------------------------------------- size bias (issue 15)

def _het(partition: dict, **heterogeneity):
    from hetfed.config import build_config
    from hetfed.pipeline import prepare

    floor = {"min_size": 1} if partition.get("kind") == "dirichlet" else {}  # the only partitioner with a floor
    cfg = build_config({"partition": {**floor, **partition}, "heterogeneity": heterogeneity})
    return prepare(cfg, progress=False).heterogeneity


@pytest.mark.parametrize("on", ["train", "all"])
@pytest.mark.parametrize("clients", [5, 20, 80])
def test_the_excess_is_near_zero_for_iid_splits_of_any_client_count(clients, on):
    """Raw Γ of an IID split grows ~15× from 5 to 80 clients; Γ − Γ_IID stays within 10% of Γ_IID of 0."""
    h = _het({"kind": "iid", "clients": clients}, on=on)
    assert abs(h.gamma_excess) <= 0.1 * h.gamma_iid, (h.gamma, h.gamma_iid)
    assert h.measured_on == on


def test_the_excess_grows_with_skew_at_fixed_size_while_raw_gamma_confuses_size_with_skew():
    excess = [_het({"kind": "feature_clusters", "clients": 10, "shuffle": s}).gamma_excess for s in (1.0, 0.5, 0.0)]
    assert excess[0] < excess[1] < excess[2]
    assert abs(excess[0]) < 0.1 and excess[2] > 0.5
    dirichlet = [_het({"kind": "dirichlet", "clients": 10, "alpha": a,
                       "min_size": 5}).gamma_excess for a in (100, 1.0, 0.1)]
    assert dirichlet[0] < dirichlet[1] < dirichlet[2]
    # an IID split into 80 small clients has a larger raw Γ than the most skewed split into 10 …
    iid_small = _het({"kind": "iid", "clients": 80})
    skewed = _het({"kind": "feature_clusters", "clients": 10, "shuffle": 0.0})
    assert iid_small.gamma > skewed.gamma
    # … and the excess puts them the right way round
    assert iid_small.gamma_excess < 0.1 * iid_small.gamma_iid < skewed.gamma_excess


def test_the_iid_reference_scores_a_bounded_number_of_clients(monkeypatch):
    from hetfed import heterogeneity as het

    calls = {"n": 0}
    one, batch = het._client_distance, het._batched_distances

    def counting(*a, **k):
        calls["n"] += 1
        return one(*a, **k)

    def counting_batch(p, clients):
        calls["n"] += len(clients)
        return batch(p, clients)

    monkeypatch.setattr(het, "_client_distance", counting)
    monkeypatch.setattr(het, "_batched_distances", counting_batch)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 4))
    clients = np.array_split(rng.permutation(3000), 1000)
    mean, sd = het.gamma_iid(x, clients, draws=3, max_clients=50)
    assert calls["n"] == 150 and mean > 0 and sd >= 0


def test_the_extrapolated_estimator_removes_most_of_the_size_bias_for_large_clients():
    plain = _het({"kind": "iid", "clients": 20}, on="all")
    extrapolated = _het({"kind": "iid", "clients": 20}, on="all", estimator="extrapolated")
    assert extrapolated.gamma < 0.25 * plain.gamma
    skewed = _het({"kind": "feature_clusters", "clients": 20, "shuffle": 0.0}, on="all", estimator="extrapolated")
    assert skewed.gamma > 10 * extrapolated.gamma


def test_every_output_says_what_gamma_was_measured_on(tmp_path, capsys):
    import json

    from hetfed.cli import main

    assert main(["partition", "--json", "--set", "heterogeneity.on=all"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["gamma_measured_on"] == "all" and {"gamma_iid", "gamma_excess"} <= set(report)
    assert main(["run", "--set", "train.rounds=1", "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "Γ_IID" in out and "ΔΓ" in out and "train data" in out
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["heterogeneity"]["gamma_measured_on"] == "train"
    assert summary["heterogeneity"]["gamma_excess"] == pytest.approx(
        summary["heterogeneity"]["gamma"] - summary["heterogeneity"]["gamma_iid"])



@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.integers(2, 6), st.integers(1, 12), st.sampled_from(["plain", "extrapolated"]))
def test_gamma_reads_rows_as_float64_without_copying_the_data_and_the_iid_draws_share_one_pool(seed, k, d, estimator):
    """#74 §2: Γ of float32 data is Γ of the same data made float64 first, to the bit (each client's rows are read as
    float64 when used, not the whole array copied), and the IID reference's draws, which re-deal the same samples,
    share one pool: the same as each draw pooling its own (as they did), to float rounding."""
    from hetfed import heterogeneity as het

    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(40 * k, d)) * rng.uniform(0.1, 10, size=d)).astype(np.float32)
    clients = np.array_split(rng.permutation(len(x))[: 35 * k], k)
    assert gamma(x, clients, estimator) == gamma(x.astype(np.float64), clients, estimator)
    draws = np.random.default_rng([seed, 0x61D])  # gamma_iid's draws, each pooling its own samples
    sizes, samples, own = [len(c) for c in clients], np.concatenate(clients), []
    for _ in range(3):
        shuffled = np.split(draws.permutation(samples), np.cumsum(sizes)[:-1])
        which = sorted(draws.choice(k, k, replace=False).tolist())
        own.append(np.mean(het.client_distances(x, shuffled, which, estimator, draws)))
    mean, sd = het.gamma_iid(x, clients, draws=3, seed=seed, estimator=estimator)
    assert (mean, sd) == pytest.approx((np.mean(own), np.std(own, ddof=1)), rel=1e-9, abs=1e-12)  # to rounding
