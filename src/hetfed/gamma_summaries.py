"""Γ of a real federation, from what each client sends once: its count, feature sum and sum of outer products.

Γ (CGAU paper, eqs. 2–3) needs, per client, only the mean and covariance of its features and
those of everyone else — and "everyone else" is the total minus the client. So a client that
sends ``(n_k, Σ x, Σ x xᵀ)`` once, before training, lets the server compute Γ exactly as
:func:`hetfed.heterogeneity.gamma` does on pooled data (tested equal), without seeing a sample.

What the summaries reveal: the client's sample count, the mean of its features and their
covariance (d + d(d+1)/2 numbers) — enough to tell, e.g., which region of feature space a
hospital's patients occupy, not any single record. With ``noise_multiplier`` σ each summary is
released through the Gaussian mechanism (features clipped to L2 norm ``clip`` = C; one record
changes ``(n, Σx, Σxxᵀ)`` by at most Δ = √(1 + C² + C⁴) in L2), and :func:`summary_epsilon` gives
the record-level (ε, δ) of that one release (Google's ``dp-accounting``, as DP-FedAvg's).

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

from hetfed.heterogeneity import frechet_distance


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


def sensitivity(clip: float) -> float:
    """L2 change of ``(n, Σx, Σxxᵀ)`` when one record of norm ≤ ``clip`` is added or removed."""
    return float(np.sqrt(1.0 + clip**2 + clip**4))


def privatise(summary: ClientSummary, clip: float, noise_multiplier: float,
              rng: np.random.Generator) -> ClientSummary:
    """The Gaussian mechanism on a summary of clipped rows: N(0, (σΔ)²) on the count, every coordinate
    of Σx and every entry of Σxxᵀ's upper triangle (mirrored, so the matrix stays symmetric)."""
    std = noise_multiplier * sensitivity(clip)
    d = len(summary.total)
    upper = np.triu(rng.normal(0.0, std, (d, d)))
    noise = upper + np.triu(upper, 1).T
    return ClientSummary(summary.n + rng.normal(0.0, std), summary.total + rng.normal(0.0, std, d),
                         summary.outer + noise)


def summary_epsilon(noise_multiplier: float, delta: float) -> float:
    """Record-level ε of one Gaussian-mechanism release of a summary at ``delta``: DP-FedAvg's accountant
    for one unsampled round (dp-accounting's RDP accountant)."""
    from hetfed.engine.privacy import epsilon

    return epsilon(noise_multiplier, 1.0, 1, delta)


def client_distances_from_summaries(summaries: Sequence[ClientSummary]) -> list[float]:
    """Per client: FD(its Gaussian, the pooled Gaussian of every other client), from the summaries alone."""
    n_all = sum(s.n for s in summaries)
    total = np.sum([s.total for s in summaries], axis=0)
    outer = np.sum([s.outer for s in summaries], axis=0)
    centre = total / n_all  # centring on the pooled mean keeps the subtraction below well conditioned

    def centred(n: float, t: np.ndarray, o: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return t - n * centre, o - np.outer(t, centre) - np.outer(centre, t) + n * np.outer(centre, centre)

    t_all, o_all = centred(n_all, total, outer)
    out = []
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
    from scipy.stats import wishart

    mean = rng.multivariate_normal(mu, cov / n, method="eigh")
    scatter = wishart(df=n - 1, scale=cov).rvs(random_state=rng) if d > 1 else \
        np.atleast_2d(cov[0, 0] * rng.chisquare(n - 1))
    scatter = np.atleast_2d(scatter)
    return ClientSummary(float(n), n * mean, scatter + n * np.outer(mean, mean))


def gamma_iid_from_summaries(summaries: Sequence[ClientSummary], draws: int = 3, max_clients: int = 100,
                             seed: int = 0) -> tuple[float, float]:
    """The parametric size-matched reference: Γ of clients of the same sizes drawn from the pooled Gaussian
    (mean, sd over ``draws``; each draw scores at most ``max_clients`` clients, as :func:`hetfed.heterogeneity.gamma_iid`)."""
    if len(summaries) < 2 or draws < 1:
        return float("nan"), float("nan")
    rng = np.random.default_rng([seed, 0x61E])
    n_all = sum(s.n for s in summaries)
    mu, cov = ClientSummary(n_all, np.sum([s.total for s in summaries], axis=0),
                            np.sum([s.outer for s in summaries], axis=0)).moments()
    cov = (cov + cov.T) / 2
    vals, vecs = np.linalg.eigh(cov)
    cov = (vecs * np.clip(vals, 0, None)) @ vecs.T  # noise may leave a tiny negative eigenvalue
    values = []
    for _ in range(draws):
        drawn = [gaussian_summary(max(int(round(s.n)), 1), mu, cov, rng) for s in summaries]
        which = rng.choice(len(drawn), min(max_clients, len(drawn)), replace=False)
        distances = client_distances_from_summaries(drawn)
        values.append(float(np.mean([distances[k] for k in which])))
    return float(np.mean(values)), float(np.std(values, ddof=1)) if draws > 1 else 0.0
