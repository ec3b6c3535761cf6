"""scikit-learn's k-means (``KMeans(n_clusters=k, n_init=n, random_state=seed).fit(x)``, one thread) without its
per-call machinery: the same labels and centres to the bit, 2.5× faster on the small problems a partition solves
(12.7 → 5.0 ms a fit of 180 points, 10 clusters, 4 restarts; ``results/benchmarks_cpu_2026-12-01c``).

``feature_clusters`` fits one k-means per class per seed — 10 fits on ~180 points for digits, 200 for a 20-seed
sweep. On problems that small most of scikit-learn's time is its validation, array-API dispatch and the
``_euclidean_distances`` calls of its k-means++ (one per candidate batch, each re-checking its arrays).
Here the estimator's ``fit`` (centring, tolerance, the restarts and which one is kept) and k-means++ are written out
in the order scikit-learn computes them — the distances upcast to float64 in scikit-learn's own chunks, so a
matrix product sees the shapes it sees there — and Lloyd's iterations are scikit-learn's own compiled function.
A test fits both on random problems of both float widths and on every class of the bundled data (equal to the bit);
it fails, rather than the clients silently moving, if scikit-learn changes either. (Written from scikit-learn 1.9,
the floor the package asks for: older versions' k-means++ summed its weighted distances in float64, and so gave other
clusters — and other clients — for the same seed.)
"""

from __future__ import annotations

import math
import warnings

import numpy as np


def kmeans(x: np.ndarray, k: int, n_init: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(labels, centres) of ``sklearn.cluster.KMeans(n_clusters=k, n_init=n_init, random_state=seed).fit(x)``
    with one OpenMP thread (``feature_clusters`` pins it: the sums' order depends on the thread count)."""
    from sklearn.cluster._kmeans import _is_same_clustering, _kmeans_single_lloyd
    from sklearn.exceptions import ConvergenceWarning

    dtype = np.float32 if x.dtype == np.float32 else np.float64
    x = np.array(x, dtype=dtype, order="C", copy=True)
    tol = np.mean(np.var(x, axis=0)) * 1e-4
    weight = np.ones(len(x), dtype=dtype)
    mean = x.mean(axis=0)
    x -= mean
    square_norms = np.einsum("ij,ij->i", x, x)
    rng = np.random.RandomState(seed)
    to = _Distances(x, square_norms)
    best: tuple[np.ndarray, float, np.ndarray] | None = None
    for _ in range(n_init):
        start = _plusplus(x, k, to, weight, rng)
        labels, inertia, centres, _ = _kmeans_single_lloyd(x, weight, start, max_iter=300, verbose=False, tol=tol,
                                                           n_threads=1)
        if best is None or (inertia < best[1] and not _is_same_clustering(labels, best[0], k)):
            best = labels, inertia, centres
    assert best is not None
    labels, _, centres = best
    centres += mean
    if len(set(labels)) < k:
        warnings.warn(f"Number of distinct clusters ({len(set(labels))}) found smaller than n_clusters ({k}). "
                      "Possibly due to duplicate points in X.", ConvergenceWarning, stacklevel=2)
    return labels, centres


def _plusplus(x: np.ndarray, k: int, to: _Distances, weight: np.ndarray, rng: np.random.RandomState) -> np.ndarray:
    """scikit-learn's ``_kmeans_plusplus`` (greedy, 2 + ⌊ln k⌋ trials a centre) on centred dense ``x`` (``to``: the
    squared distances to its rows)."""
    n = len(x)
    centres = np.empty((k, x.shape[1]), dtype=x.dtype)
    trials = 2 + int(np.log(k))
    first = rng.choice(n, p=weight / weight.sum())
    centres[0] = x[first]
    closest = to(centres[0, np.newaxis])
    potential = closest @ weight
    for c in range(1, k):
        draws = rng.uniform(size=trials) * potential
        candidates = np.searchsorted(np.cumsum(weight * closest), draws)
        np.minimum(candidates, closest.size - 1, out=candidates)
        to_candidates = to(x[candidates])
        np.minimum(closest, to_candidates, out=to_candidates)
        potentials = to_candidates @ weight.reshape(-1, 1)
        best = np.argmin(potentials)
        potential = potentials[best]
        closest = to_candidates[best]
        centres[c] = x[candidates[best]]
    return centres


class _Distances:
    """scikit-learn's ``_euclidean_distances(a, x, Y_norm_squared=x_norms, squared=True)`` from rows ``a`` to every
    row of dense ``x`` (a ≠ x): float32 inputs upcast to float64 chunk by chunk (their float32 norms unused, as
    there), float64 ones in one product. ``x``'s upcast chunks and their norms are made once, not once a call."""

    def __init__(self, x: np.ndarray, x_norms: np.ndarray):
        self.x, self.x_norms = x, x_norms
        self._chunks: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {}

    def __call__(self, a: np.ndarray) -> np.ndarray:
        x = self.x
        if x.dtype != np.float32:
            out = -2 * (a @ x.T)
            out += np.einsum("ij,ij->i", a, a)[:, None]
            out += self.x_norms.reshape(1, -1)
        else:
            out = np.empty((len(a), len(x)), dtype=np.float32)
            size = _batch(len(a), len(x), x.shape[1])
            chunks = self._chunks.get(size) or self._chunks.setdefault(size, [
                (c, np.einsum("ij,ij->i", c, c)[None, :])
                for c in (x[j:j + size].astype(np.float64) for j in range(0, len(x), size))])
            for i in range(0, len(a), size):
                a64 = a[i:i + size].astype(np.float64)
                a_norms = np.einsum("ij,ij->i", a64, a64)[:, None]
                for j, (x64, x_norms) in zip(range(0, len(x), size), chunks, strict=True):
                    d = -2 * (a64 @ x64.T)
                    d += a_norms
                    d += x_norms
                    out[i:i + size, j:j + size] = d.astype(np.float32, copy=False)
        np.maximum(out, 0, out=out)
        return out


def _batch(n_a: int, n_x: int, d: int) -> int:
    """The chunk ``_euclidean_distances_upcast`` works in: ~10 % more memory, at least 10 MiB."""
    most = max(((n_a + n_x) * d + n_a * n_x) / 10, 10 * 2**17)
    spread = 2 * d
    return max(int((-spread + math.sqrt(spread**2 + 4 * most)) / 2), 1)
