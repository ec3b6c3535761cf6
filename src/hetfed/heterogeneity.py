"""How heterogeneous are the clients? Feature skew (Γ) and label skew.

- Fréchet distance between Gaussians ``‖μ1−μ2‖² + Tr(Σ1 + Σ2 − 2(Σ1Σ2)^{1/2})``,
  computed stably: ``Tr((Σ1Σ2)^{1/2}) = Σ sqrt(eig(√Σ1 Σ2 √Σ1))``, where the inner
  matrix is symmetric PSD, so singular or ill-conditioned covariances (a client
  with fewer samples than dimensions) never produce complex or NaN results.
- Γ (CGAU paper, eqs. 2–3): mean over clients of the Fréchet distance between the
  client's Gaussian and the pooled Gaussian of all other clients.
- Label skew (Zhao et al. 2018): per-client class histograms, the earth mover's
  distance of each client's label distribution to the global one (with the 0/1
  ground metric between classes this is ``Σ_c |p_k(c) − p(c)|``), and the mean
  Jensen–Shannon divergence (base 2, in [0, 1]).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def _psd_sqrt(s: np.ndarray) -> np.ndarray:
    vals, vecs = np.linalg.eigh((s + s.T) / 2)
    return (vecs * np.sqrt(np.clip(vals, 0, None))) @ vecs.T


def frechet_distance(mu1: np.ndarray, s1: np.ndarray, mu2: np.ndarray, s2: np.ndarray) -> float:
    """Fréchet (2-Wasserstein²) distance between N(mu1, s1) and N(mu2, s2); ≥ 0."""
    mu1, mu2 = np.asarray(mu1, np.float64), np.asarray(mu2, np.float64)
    s1, s2 = np.atleast_2d(np.asarray(s1, np.float64)), np.atleast_2d(np.asarray(s2, np.float64))
    if mu1.shape != mu2.shape or s1.shape != s2.shape or s1.shape != (mu1.size, mu1.size):
        raise ValueError(f"shapes do not match: mu {mu1.shape}, {mu2.shape}; sigma {s1.shape}, {s2.shape}")
    root1 = _psd_sqrt(s1)
    inner = root1 @ s2 @ root1
    cross = np.sqrt(np.clip(np.linalg.eigvalsh((inner + inner.T) / 2), 0, None)).sum()
    diff = mu1 - mu2
    value = float(diff @ diff + np.trace(s1) + np.trace(s2) - 2 * cross)
    return max(value, 0.0)


def gaussian(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (unbiased) covariance of the rows of x; zero covariance for one row."""
    x = np.asarray(x, np.float64).reshape(len(x), -1)
    mu = x.mean(axis=0)
    if len(x) < 2:
        return mu, np.zeros((x.shape[1], x.shape[1]))
    return mu, np.cov(x, rowvar=False).reshape(x.shape[1], x.shape[1])


def frechet_from_factor(mu1: np.ndarray, u1: np.ndarray, mu2: np.ndarray, s2: np.ndarray) -> float:
    """Fréchet distance when ``Σ1 = U1 U1ᵀ`` is given by a thin factor ``U1`` (d × r).

    The non-zero eigenvalues of ``Σ1Σ2`` are those of ``U1ᵀ Σ2 U1`` (r × r), so a
    client with r < d samples costs an r × r eigenproblem instead of d × d.
    """
    inner = u1.T @ s2 @ u1
    cross = np.sqrt(np.clip(np.linalg.eigvalsh((inner + inner.T) / 2), 0, None)).sum()
    diff = np.asarray(mu1, np.float64) - np.asarray(mu2, np.float64)
    return max(float(diff @ diff + np.sum(u1 * u1) + np.trace(s2) - 2 * cross), 0.0)


def gamma(x: np.ndarray, clients: list[np.ndarray]) -> float:
    """Γ: mean over clients of FD(client's Gaussian, all other clients' pooled Gaussian).

    The pooled "others" moments come from sufficient statistics (total minus the
    client's), so the cost does not grow with K × N × d²; features are centred
    on the pooled mean first for numerical stability.
    """
    if len(clients) < 2:
        return 0.0
    flat = np.asarray(x, np.float64).reshape(len(x), -1)
    every = np.concatenate(clients)
    centre = flat[every].mean(axis=0)
    total_sum = (flat[every] - centre).sum(axis=0)
    total_xx = (flat[every] - centre).T @ (flat[every] - centre)
    n_total = len(every)
    distances = []
    for idx in clients:
        xc = flat[idx] - centre
        n_k, n_o = len(idx), n_total - len(idx)
        sum_k = xc.sum(axis=0)
        mu_k = sum_k / max(n_k, 1)
        mu_o = (total_sum - sum_k) / max(n_o, 1)
        xx_o = total_xx - xc.T @ xc
        s_o = (xx_o - n_o * np.outer(mu_o, mu_o)) / max(n_o - 1, 1)
        d = flat.shape[1]
        if n_k < 2:
            distances.append(frechet_distance(mu_k, np.zeros((d, d)), mu_o, s_o))
        elif n_k <= d:  # low rank: Σ_k = U Uᵀ with U = (X_k − μ_k)ᵀ / √(n_k − 1)
            u = (xc - mu_k).T / np.sqrt(n_k - 1)
            distances.append(frechet_from_factor(mu_k, u, mu_o, s_o))
        else:
            s_k = (xc - mu_k).T @ (xc - mu_k) / (n_k - 1)
            distances.append(frechet_distance(mu_k, s_k, mu_o, s_o))
    return float(np.mean(distances))


def gamma_reference(x: np.ndarray, clients: list[np.ndarray]) -> float:
    """Γ straight from the definition (slow; the reference :func:`gamma` is tested against)."""
    flat = np.asarray(x, np.float64).reshape(len(x), -1)
    out = []
    for k, idx in enumerate(clients):
        others = np.concatenate([c for j, c in enumerate(clients) if j != k])
        out.append(frechet_distance(*gaussian(flat[idx]), *gaussian(flat[others])))
    return float(np.mean(out))


def class_histograms(y: np.ndarray, clients: list[np.ndarray], n_classes: int) -> np.ndarray:
    """K × C counts of each class per client."""
    return np.stack([np.bincount(y[idx], minlength=n_classes) for idx in clients])


def _distributions(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    counts = np.asarray(counts, np.float64)
    per_client = counts / np.clip(counts.sum(axis=1, keepdims=True), 1, None)
    overall = counts.sum(axis=0) / max(counts.sum(), 1)
    return per_client, overall


def label_emd(counts: np.ndarray) -> np.ndarray:
    """Per client: Σ_c |p_k(c) − p(c)| against the pooled label distribution (0 … 2)."""
    p, q = _distributions(counts)
    return np.abs(p - q).sum(axis=1)


def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """Jensen–Shannon divergence in bits (0 for equal distributions, ≤ 1)."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    m = (p + q) / 2

    def kl(a, b):
        mask = a > 0
        return float(np.sum(a[mask] * np.log2(a[mask] / b[mask])))

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


@dataclass(frozen=True)
class Heterogeneity:
    """The measurements ``hetfed partition`` prints."""

    gamma: float
    label_emd: list[float]
    label_emd_mean: float
    js_mean: float
    class_counts: list[list[int]]

    def as_dict(self) -> dict:
        return {
            "gamma": self.gamma,
            "label_emd_mean": self.label_emd_mean,
            "js_mean": self.js_mean,
            "label_emd": self.label_emd,
        }


def measure(x: np.ndarray, y: np.ndarray, clients: list[np.ndarray], n_classes: int) -> Heterogeneity:
    """Γ on the features plus the label-skew figures, for one partition."""
    counts = class_histograms(y, clients, n_classes)
    emd = label_emd(counts)
    p, q = _distributions(counts)
    js = [js_divergence(row, q) for row in p]
    return Heterogeneity(
        gamma=gamma(x, clients),
        label_emd=[float(v) for v in emd],
        label_emd_mean=float(emd.mean()),
        js_mean=float(np.mean(js)),
        class_counts=counts.tolist(),
    )
