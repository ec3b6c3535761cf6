"""Γ of a real federation, from what each client sends once: its count, feature sum and sum of outer products.

Γ (CGAU paper, eqs. 2–3) needs, per client, only the mean and covariance of its features and
those of everyone else — and "everyone else" is the total minus the client. So a client that
sends ``(n_k, Σ x, Σ x xᵀ)`` once, before training, lets the server compute Γ exactly as
:func:`hetfed.heterogeneity.gamma` does on pooled data (tested equal), without seeing a sample.

What the summaries reveal: the client's sample count, the mean of its features and their
covariance (d + d(d+1)/2 numbers) — enough to tell, e.g., which region of feature space a
hospital's patients occupy, not any single record. With ``noise_multiplier`` σ each summary is
released through the Gaussian mechanism (features clipped to L2 norm ``clip`` = C): the three parts
are scaled to sensitivity 1 each — ``(n, Σx/C, Σxxᵀ/C²)``, which one record changes by at most √3
in L2 — noised with N(0, 3σ²) per coordinate and scaled back, so the count's noise is σ√3, the sum's
σ√3·C and the scatter's σ√3·C² (one Δ = √(1 + C² + C⁴) for all three made the count's noise 129·σ
at C = 8, drowning clients of hundreds). :func:`summary_epsilon` gives the record-level (ε, δ) of
that one release (Google's ``dp-accounting``, as DP-FedAvg's).

A noised release is post-processed before Γ (:func:`released`): a count below 2 is raised to 2 and
each client's covariance projected onto the positive semi-definite cone (noise makes it indefinite,
and then the Fréchet distance is meaningless: clamped to 0, or 10³⁰ from a negative count); the
pooled "others" of valid summaries are then valid too. :func:`private_gamma` adds what a user needs
to trust the number: a 95% interval from re-noising the released summaries (the basic bootstrap —
the noise's bias and spread at the release stand in for those at the clean data), and the smallest
client size at which the noise adds less than a tenth of Γ to a client's distance (docs/heterogeneity.md
has the error table against σ, clip and client size).

The size-matched IID reference Γ_IID cannot re-deal samples the server never had; here it is
parametric: Γ of clients of the same sizes drawn from the pooled Gaussian N(μ, Σ), sampled as
sufficient statistics directly (the mean ~ N(μ, Σ/n_k), the scatter ~ Wishart(n_k − 1, Σ)). It
equals the data's Γ_IID when the features are Gaussian; for other data it is the sampling-noise
floor of Gaussian clients with these sizes and this covariance (docs/heterogeneity.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from hetfed.heterogeneity import frechet_distance, one_blas_thread


@dataclass(frozen=True)
class ClientSummary:
    """What one client sends for Γ: its count, Σ x and Σ x xᵀ (float64)."""

    n: float
    total: np.ndarray  # (d,)
    outer: np.ndarray  # (d, d), symmetric

    def moments(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean and unbiased covariance (zero covariance for fewer than two samples)."""
        n = max(self.n, 1e-12)
        mu = self.total / n
        if self.n < 2:
            return mu, np.zeros_like(self.outer)
        return mu, (self.outer - n * np.outer(mu, mu)) / (n - 1)


def summarise(x: np.ndarray, clip: float | None = None) -> ClientSummary:
    """A client's summary of its feature rows (each row first scaled to L2 norm ≤ ``clip`` when set)."""
    flat = np.asarray(x, np.float64).reshape(len(x), -1)
    if clip is not None:
        norms = np.linalg.norm(flat, axis=1, keepdims=True)
        flat = flat * np.minimum(1.0, clip / np.maximum(norms, 1e-12))
    return ClientSummary(float(len(flat)), flat.sum(axis=0), flat.T @ flat)


#: L2 change of the scaled summary ``(n, Σx/C, Σxxᵀ/C²)`` when one record of norm ≤ C is added or removed
SENSITIVITY = float(np.sqrt(3.0))


def noise_stds(clip: float, noise_multiplier: float) -> tuple[float, float, float]:
    """The noise's standard deviation on the count, on each coordinate of Σx and on each entry of Σxxᵀ."""
    std = noise_multiplier * SENSITIVITY
    return std, std * clip, std * clip**2


def privatise(summary: ClientSummary, clip: float, noise_multiplier: float,
              rng: np.random.Generator) -> ClientSummary:
    """The Gaussian mechanism on a summary of clipped rows (:func:`noise_stds`): on the count, every
    coordinate of Σx and every entry of Σxxᵀ's upper triangle (mirrored, so the matrix stays symmetric)."""
    s_n, s_t, s_o = noise_stds(clip, noise_multiplier)
    d = len(summary.total)
    upper = np.triu(rng.normal(0.0, s_o, (d, d)))
    noise = upper + np.triu(upper, 1).T
    return ClientSummary(summary.n + rng.normal(0.0, s_n), summary.total + rng.normal(0.0, s_t, d),
                         summary.outer + noise)


def released(summary: ClientSummary) -> ClientSummary:
    """A noised summary made valid (post-processing: no privacy cost): count ≥ 2 and a positive
    semi-definite covariance, with its mean kept."""
    n = max(float(summary.n), 2.0)
    mu = summary.total / n
    cov = psd((summary.outer - n * np.outer(mu, mu)) / (n - 1))
    return ClientSummary(n, summary.total, (n - 1) * cov + n * np.outer(mu, mu))


def psd(cov: np.ndarray) -> np.ndarray:
    """The nearest positive semi-definite matrix (symmetrised, negative eigenvalues set to 0)."""
    vals, vecs = np.linalg.eigh((cov + cov.T) / 2)
    return (vecs * np.clip(vals, 0.0, None)) @ vecs.T


def pooled(summaries: Sequence[ClientSummary]) -> ClientSummary:
    """Every client's summary summed: the federation's own."""
    return ClientSummary(sum(s.n for s in summaries), np.sum([s.total for s in summaries], axis=0),
                         np.sum([s.outer for s in summaries], axis=0))


@dataclass(frozen=True)
class PrivateGamma:
    """Γ from noised summaries, and how far the noise lets it be trusted.

    gamma: the bias-corrected estimate 2Γ̂ − mean Γ* (cut at 0), Γ̂ (released) being Γ of the post-processed
    release and Γ* its re-noisings; low, high: the 95% interval (basic bootstrap over ``draws`` re-noisings);
    min_client_size: the smallest client size at which the noise adds less than a tenth of Γ to a client's
    distance; clients_below: how many clients are smaller (by their released count)."""

    gamma: float
    released: float
    low: float
    high: float
    min_client_size: int
    clients_below: int
    draws: int

    def as_dict(self) -> dict:
        return {"gamma": self.gamma, "gamma_released": self.released, "gamma_low": self.low, "gamma_high": self.high,
                "min_client_size": self.min_client_size, "clients_below_min_size": self.clients_below,
                "interval_draws": self.draws}


#: the client sizes tried for :attr:`PrivateGamma.min_client_size` (2, 4, …, 2²⁴)
_SIZES = tuple(2**k for k in range(1, 25))


def private_gamma(summaries: Sequence[ClientSummary], clip: float, noise_multiplier: float, draws: int = 100,
                  seed: int = 0) -> PrivateGamma:
    """Γ of noised summaries (each :func:`released`), its 95% interval and the client size it needs.

    The interval is the basic bootstrap: the release is noised again ``draws`` times with the same
    mechanism, and Γ's spread and shift under that extra noise stand for the release's own around the
    noise-free Γ: [2Γ̂ − q₀.₉₇₅, 2Γ̂ − q₀.₀₂₅] of the re-noised Γ*, cut at 0; the estimate is the shift
    removed, 2Γ̂ − mean Γ*. Post-processing only: it
    costs no privacy. (Its coverage of the noise-free Γ is measured in docs/heterogeneity.md.)
    """
    rng = np.random.default_rng([seed, 0x9A33])
    valid = [released(s) for s in summaries]
    g = gamma_from_summaries(valid)
    again = np.array([gamma_from_summaries([released(privatise(s, clip, noise_multiplier, rng)) for s in summaries])
                      for _ in range(draws)])
    low, high = 2 * g - np.quantile(again, 0.975), 2 * g - np.quantile(again, 0.025)
    corrected = 2 * g - float(again.mean())
    n_min = min_client_size(valid, clip, noise_multiplier, 0.1 * (corrected if corrected > 0 else g), rng)
    below = sum(s.n < n_min for s in summaries)
    return PrivateGamma(max(corrected, 0.0), g, max(float(low), 0.0), max(float(high), 0.0), n_min, below, draws)


def private_gamma_report(summaries: Sequence[ClientSummary], clip: float, noise_multiplier: float,
                         seed: int = 0) -> dict:
    """What a run records of Γ from noised summaries: :class:`PrivateGamma`'s fields, and a ``warning``
    when clients are smaller than the size the estimate needs (there the interval does not hold either:
    its coverage collapses, docs/heterogeneity.md)."""
    pg = private_gamma(summaries, clip, noise_multiplier, seed=seed)
    out = pg.as_dict()
    if pg.clients_below:
        out["warning"] = (f"Γ from noised summaries is dominated by the noise: {pg.clients_below} of "
                          f"{len(summaries)} clients hold fewer than {pg.min_client_size} samples, the size at which "
                          f"the noise (flower.summary_noise = {noise_multiplier:g}, flower.summary_clip = {clip:g}) "
                          "moves a client's distance by less than a tenth of Γ; the estimate "
                          f"{pg.gamma:.4g} [{pg.low:.4g}, {pg.high:.4g}] is not to be trusted — lower the noise or the "
                          "clip, or measure on larger clients")
    return out


def min_client_size(valid: Sequence[ClientSummary], clip: float, noise_multiplier: float, tolerance: float,
                    rng: np.random.Generator, repeats: int = 3) -> int:
    """The smallest client size (of :data:`_SIZES`) at which the mechanism's noise moves a client's Gaussian
    by less than ``tolerance`` in Fréchet distance (mean over ``repeats`` clients of that size drawn from the
    pooled Gaussian of the release); the largest size tried when none is."""
    mu, cov = pooled(valid).moments()
    for n in _SIZES:
        moved = []
        for _ in range(repeats):
            clean = gaussian_summary(n, mu, cov, rng)
            m0, c0 = clean.moments()
            m1, c1 = released(privatise(clean, clip, noise_multiplier, rng)).moments()
            moved.append(frechet_distance(m0, c0, m1, c1))
        if float(np.mean(moved)) < tolerance:
            return n
    return _SIZES[-1]


def summary_epsilon(noise_multiplier: float, delta: float) -> float:
    """Record-level ε of one Gaussian-mechanism release of a summary at ``delta``: DP-FedAvg's accountant
    for one unsampled round (dp-accounting's RDP accountant)."""
    from hetfed.engine.privacy import epsilon

    return epsilon(noise_multiplier, 1.0, 1, delta)


def client_distances_from_summaries(summaries: Sequence[ClientSummary]) -> list[float]:
    """Per client: FD(its Gaussian, the pooled Gaussian of every other client), from the summaries alone."""
    everyone = pooled(summaries)
    n_all, total, outer = everyone.n, everyone.total, everyone.outer
    centre = total / n_all  # centring on the pooled mean keeps the subtraction below well conditioned

    def centred(n: float, t: np.ndarray, o: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return t - n * centre, o - np.outer(t, centre) - np.outer(centre, t) + n * np.outer(centre, centre)

    t_all, o_all = centred(n_all, total, outer)
    out = []
    with one_blas_thread():  # the same number however many threads the BLAS has, as the simulation's Γ
        for s in summaries:
            t_k, o_k = centred(s.n, s.total, s.outer)
            mu_k, cov_k = ClientSummary(s.n, t_k, o_k).moments()
            mu_o, cov_o = ClientSummary(n_all - s.n, t_all - t_k, o_all - o_k).moments()
            out.append(frechet_distance(mu_k, cov_k, mu_o, cov_o))
    return out


def gamma_from_summaries(summaries: Sequence[ClientSummary]) -> float:
    """Γ: the mean of :func:`client_distances_from_summaries` (NaN for fewer than two clients)."""
    if len(summaries) < 2:
        return float("nan")
    return float(np.mean(client_distances_from_summaries(summaries)))


def gaussian_summary(n: int, mu: np.ndarray, cov: np.ndarray, rng: np.random.Generator) -> ClientSummary:
    """The summary of ``n`` samples from N(mu, cov), drawn as sufficient statistics (no samples when n > d)."""
    d = len(mu)
    if n <= d + 1:  # Wishart needs n − 1 ≥ d degrees of freedom: draw the few samples instead
        return summarise(rng.multivariate_normal(mu, cov, size=n, method="eigh"))
    mean = rng.multivariate_normal(mu, cov / n, method="eigh")
    scatter = _wishart(n - 1, cov, rng) if d > 1 else np.atleast_2d(cov[0, 0] * rng.chisquare(n - 1))
    scatter = np.atleast_2d(scatter)
    return ClientSummary(float(n), n * mean, scatter + n * np.outer(mean, mean))


def _wishart(df: int, cov: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A scatter matrix drawn from Wishart(df, cov). scipy's needs a positive-definite ``cov``; a singular one — a
    feature constant on every client (digits' blank corner pixels), whose variance is 0 — gets the singular Wishart
    F·W(df, I)·Fᵀ with cov = F·Fᵀ (F from its eigendecomposition): what the scatter of df draws from N(0, cov) is.
    (The positive-definite case draws as before.)"""
    from scipy.stats import wishart

    try:
        return np.asarray(wishart(df=df, scale=cov).rvs(random_state=rng))
    except np.linalg.LinAlgError:
        values, vectors = np.linalg.eigh(cov)
        factor = vectors * np.sqrt(np.clip(values, 0.0, None))
        return factor @ wishart(df=df, scale=np.eye(len(cov))).rvs(random_state=rng) @ factor.T


def gamma_iid_from_summaries(summaries: Sequence[ClientSummary], draws: int = 3, max_clients: int = 100,
                             seed: int = 0) -> tuple[float, float]:
    """The parametric size-matched reference: Γ of clients of the same sizes drawn from the pooled Gaussian
    (mean, sd over ``draws``; each draw scores at most ``max_clients`` clients, as
    :func:`hetfed.heterogeneity.gamma_iid`)."""
    if len(summaries) < 2 or draws < 1:
        return float("nan"), float("nan")
    rng = np.random.default_rng([seed, 0x61E])
    mu, cov = pooled(summaries).moments()
    cov = psd(cov)  # noise may leave a tiny negative eigenvalue
    values = []
    for _ in range(draws):
        drawn = [gaussian_summary(max(int(round(s.n)), 1), mu, cov, rng) for s in summaries]
        which = rng.choice(len(drawn), min(max_clients, len(drawn)), replace=False)
        distances = client_distances_from_summaries(drawn)
        values.append(float(np.mean([distances[k] for k in which])))
    return float(np.mean(values)), float(np.std(values, ddof=1)) if draws > 1 else 0.0
