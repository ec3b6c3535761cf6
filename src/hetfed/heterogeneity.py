"""How heterogeneous are the clients? Feature skew (Γ) and label skew.

- Fréchet distance between Gaussians ``‖μ1−μ2‖² + Tr(Σ1 + Σ2 − 2(Σ1Σ2)^{1/2})``,
  computed stably: ``Tr((Σ1Σ2)^{1/2}) = Σ sqrt(eig(Fᵀ Σ2 F))`` for any factor ``Σ1 = F Fᵀ``
  (``√Σ1``; a small client's centred rows; the Cholesky factor, with the roles swapped), where
  the inner matrix is symmetric PSD, so singular or ill-conditioned covariances (a client
  with fewer samples than dimensions) never produce complex or NaN results.
- Γ (CGAU paper, eqs. 2–3): mean over clients of the Fréchet distance between the
  client's Gaussian and the pooled Gaussian of all other clients.
- **Size-matched IID reference.** Sample means and covariances of small clients
  are noisy, and the Fréchet distance turns that noise into distance: Γ grows as
  clients shrink, whatever the skew. ``gamma_iid`` is Γ of random (IID) partitions
  of the same pool into clients of the *same sizes* (a few draws, mean ± sd), and
  ``gamma_excess = Γ − Γ_IID`` is the heterogeneity beyond what sampling noise
  alone produces: ≈ 0 for an IID split of any client count, growing with skew.
  (The difference, not the ratio: the Fréchet distance's small-sample bias is
  additive, ≈ c/n — Chong & Forsyth 2020 —, so subtracting it leaves the skew in
  Γ's own units; a ratio would shrink the same skew as clients get smaller.)
- **Extrapolated estimator** (``estimator: extrapolated``, after Chong & Forsyth's
  FID∞): per client, the distance at ½, ¾ and all of its samples, fitted linearly
  in 1/n and read off at 1/n = 0. Removes the bias without a reference, but is
  noisy for clients with few samples (and needs ≥ 8 of them; smaller ones keep
  the plain value).
- Label skew (Zhao et al. 2018): per-client class histograms, the label "EMD"
  of each client's distribution to the global one as Zhao et al. define it,
  ``Σ_c |p_k(c) − p(c)|`` (range 0–2; the earth mover's distance under the 0/1
  ground metric — the total variation distance — is half of it), and the mean
  Jensen–Shannon divergence (base 2, in [0, 1]).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from hetfed.processes import available_memory


def _root_trace(inner: np.ndarray) -> np.ndarray:
    """``Tr(inner^{1/2})`` of a symmetric PSD matrix (or of each of a stack): the square roots of its eigenvalues,
    symmetrised first and those rounding made negative read as 0, summed."""
    return np.sqrt(np.clip(np.linalg.eigvalsh((inner + np.swapaxes(inner, -1, -2)) / 2), 0, None)).sum(axis=-1)


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
    cross = _root_trace(inner)
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
    client with r < d samples costs an r × r eigenproblem instead of d × d. With more columns than dimensions
    (r > d: the extrapolated estimator's subsamples) the d × d form is used: it is smaller, and the r × r one has
    r − d zero eigenvalues, computed as ±1e-15, whose square roots added ~1e-7 each.
    """
    if u1.shape[1] > u1.shape[0]:
        return frechet_distance(mu1, u1 @ u1.T, mu2, s2)
    inner = u1.T @ s2 @ u1
    cross = _root_trace(inner)
    diff = np.asarray(mu1, np.float64) - np.asarray(mu2, np.float64)
    return max(float(diff @ diff + np.sum(u1 * u1) + np.trace(s2) - 2 * cross), 0.0)


def _client_distance(p: Pool, idx: np.ndarray) -> float:
    """FD between one client's Gaussian and the pooled Gaussian of everyone else (centred data)."""
    xc = p.rows(idx)
    n_k, n_o = len(idx), p.n_total - len(idx)
    sum_k = xc.sum(axis=0)
    mu_k = sum_k / max(n_k, 1)
    mu_o = (p.total_sum - sum_k) / max(n_o, 1)
    xx_o = p.total_xx - xc.T @ xc
    s_o = (xx_o - n_o * np.outer(mu_o, mu_o)) / max(n_o - 1, 1)
    d = xc.shape[1]
    if n_k < 2:
        return frechet_distance(mu_k, np.zeros((d, d)), mu_o, s_o)
    if n_k <= d:  # low rank: Σ_k = U Uᵀ with U = (X_k − μ_k)ᵀ / √(n_k − 1)
        u = (xc - mu_k).T / np.sqrt(n_k - 1)
        return frechet_from_factor(mu_k, u, mu_o, s_o)
    centred = xc - mu_k  # one array: numpy computes ``Aᵀ A`` of one buffer as a symmetric product (~5× faster)
    return _full_rank(mu_k, centred.T @ centred / (n_k - 1), mu_o, s_o)


def _full_rank(mu1: np.ndarray, s1: np.ndarray, mu2: np.ndarray, s2: np.ndarray) -> float:
    """:func:`frechet_distance` by the Cholesky factor ``L`` of ``s2`` where it has one: the distance is symmetric, so
    it is :func:`frechet_from_factor` with ``s2 = L Lᵀ`` as the factored side (the eigenvalues of ``Lᵀ Σ1 L``) — a
    Cholesky factorisation in place of :func:`_psd_sqrt`'s eigendecomposition of ``s1``, ~6× cheaper for
    Fashion-MNIST's 784 pixels. Where ``s2`` is singular (a feature that varies on this client only: half of
    Fashion-MNIST's larger clients), :func:`frechet_distance`."""
    try:
        low = np.linalg.cholesky(s2)
    except np.linalg.LinAlgError:
        return frechet_distance(mu1, s1, mu2, s2)
    return frechet_from_factor(mu2, low, mu1, s1)


@dataclass(frozen=True, eq=False)
class Pool:
    """The pooled clients' sufficient statistics, centred on their mean: what every client's "all the others" is
    computed from (total minus the client's own).

    One pool serves Γ and every size-matched IID draw of :func:`gamma_iid`: a draw re-deals the same samples, so its
    pool is the same multiset (its statistics equal up to the order floats were summed in). ``flat`` is the data as
    given, rows as vectors, never copied whole: each client's rows are read as float64 when they are used (a
    Fashion-MNIST train split in float64 is 280 MB, and was made afresh for Γ and each draw). Only the features that
    vary in the pool are read (``kept``; None: all): a feature constant over the pool adds nothing to any distance
    (equal means, no variance), and left in it makes every covariance singular (digits' blank corner pixels).
    """

    flat: np.ndarray
    kept: np.ndarray | None
    centre: np.ndarray
    total_sum: np.ndarray
    total_xx: np.ndarray
    n_total: int

    def rows(self, idx: np.ndarray) -> np.ndarray:
        """Rows ``idx``, their varying features, as float64, centred on the pool's mean."""
        rows = self.flat[idx] if self.kept is None else self.flat[np.ix_(idx, self.kept)]
        return rows.astype(np.float64) - self.centre


def pool(x: np.ndarray, clients: list[np.ndarray]) -> Pool:
    """The pooled statistics of ``clients``' rows of ``x`` (the features that vary among them), centred on their
    mean (float64); their ``XᵀX`` on one BLAS thread, as every distance is (:func:`one_blas_thread`)."""
    flat = np.asarray(x).reshape(len(x), -1)
    every = np.concatenate(clients)
    centred = flat[every].astype(np.float64)
    varying = np.flatnonzero((centred != centred[:1]).any(axis=0)) if len(every) else np.arange(flat.shape[1])
    kept = None if len(varying) == flat.shape[1] else varying
    if kept is not None:
        centred = centred[:, kept]
    centre = centred.mean(axis=0)
    centred -= centre
    with one_blas_thread():  # the BLAS's threaded AᵀA rounds by its thread count (1e-12 of d = 140's, #74)
        gram = centred.T @ centred
    return Pool(flat, kept, centre, centred.sum(axis=0), gram, len(every))


def client_distances(x: np.ndarray, clients: list[np.ndarray], which: list[int] | None = None,
                     estimator: str = "plain", rng: np.random.Generator | None = None,
                     pooled: Pool | None = None) -> list[float]:
    """Per client (all, or ``which``): FD(client's Gaussian, all other clients' pooled Gaussian).

    The pooled "others" moments come from sufficient statistics (total minus the
    client's), so the cost does not grow with K × N × d²; features are centred
    on the pooled mean first for numerical stability. ``pooled``: the statistics of
    the same samples, already computed (:func:`pool`).
    """
    p = pooled or pool(x, clients)
    which = list(range(len(clients))) if which is None else which
    if estimator == "plain":
        return _plain_distances(p, [clients[k] for k in which])
    with one_blas_thread():  # one after another: the subsamples are drawn from ``rng`` in the clients' order
        return [_extrapolated(p, clients[k], rng or np.random.default_rng(k))
                if estimator == "extrapolated" and len(clients[k]) >= 8 else _client_distance(p, clients[k])
                for k in which]


#: the most float64 numbers (clients × largest client × features) one batch of :func:`_batched_distances` holds:
#: 32 MB. Larger sets go in several batches.
BATCH_ELEMENTS = 4_000_000


def _plain_distances(p: Pool, clients: list[np.ndarray]) -> list[float]:
    """:func:`_client_distance` of each client: those with at most as many rows as features stacked
    (:func:`_batched_distances`), by size, in batches of at most :data:`BATCH_ELEMENTS` numbers; the others (and the
    empty ones) one at a time, where numpy's symmetric ``AᵀA`` outruns a batch."""
    d = len(p.centre)
    batches: list[list[int]] = []  # by size, so a batch's largest client is its last
    for i in sorted((i for i, c in enumerate(clients) if 0 < len(c) <= d), key=lambda i: len(clients[i])):
        if batches and (len(batches[-1]) + 1) * len(clients[i]) * d <= BATCH_ELEMENTS:
            batches[-1].append(i)
        else:
            batches.append([i])
    alone = sorted((i for i, c in enumerate(clients) if not 0 < len(c) <= d), key=lambda i: -len(clients[i]))
    tasks: list[Callable[[], Any]] = [functools.partial(_client_distance, p, clients[i]) for i in alone]
    tasks += [functools.partial(_batched_distances, p, [clients[j] for j in batch]) for batch in batches]
    # the most a task holds at once, in bytes: a client's rows twice (read, centred) or a batch's arrays, and d × d's
    held = [2 * len(clients[alone[0]]) * d] if alone else []
    largest = 8 * (max(held + ([4 * BATCH_ELEMENTS] if batches else []), default=0) + 6 * d * d)
    done = _computed(tasks, d, largest)
    out = [0.0] * len(clients)
    for i, value in zip(alone, done[:len(alone)], strict=True):
        out[i] = value
    for batch, values in zip(batches, done[len(alone):], strict=True):
        for j, value in zip(batch, values, strict=True):
            out[j] = value
    return out


#: the fewest features from which :func:`_computed` computes Γ's distances side by side (``python
#: benchmarks/gamma_threads.py``, 2 cores, side by side / one after another: 1.49 on digits' 64 features, 0.99 on 128
#: synthetic ones, 0.86 on 384, 0.58 on Fashion-MNIST's 784; ``results/benchmarks_cpu_2026-12-07b``)
PARALLEL_FROM_FEATURES = 128
#: one Γ at a time sets the BLAS's threads: two at once would restore each other's limits
_LIMITING = threading.RLock()


@functools.cache
def _blas() -> Any:
    """numpy's BLAS, as :func:`one_blas_thread` limits it (found at its first use, numpy's library loaded by then)."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().select(user_api="blas")


@contextmanager
def one_blas_thread() -> Iterator[int]:
    """numpy's BLAS on one thread while Γ's distances are computed; yields how many it had (the threads they may take
    side by side instead).

    Why: LAPACK's symmetric eigensolvers round by their thread count — Γ_IID moved in its 10th digit between 1 and 2
    threads, on digits and Fashion-MNIST alike — so Γ depended on the machine's cores, and a ``hetfed sweep --jobs 2``
    run (one thread a worker) measured another Γ than the same run alone. On one thread each, Γ is the same number
    however many threads the BLAS has."""
    blas = _blas()
    with _LIMITING:
        had = max([lib.num_threads for lib in blas.lib_controllers] or [1])
        with blas.limit(limits=1):
            yield had


def _computed(tasks: Sequence[Callable[[], Any]], d: int, largest: int) -> list[Any]:
    """The tasks' results (a client's distance, or a batch's), in order, each computed on one BLAS thread
    (:func:`one_blas_thread`): from :data:`PARALLEL_FROM_FEATURES` features side by side, on as many threads as the
    BLAS had and as half the memory still available holds tasks of ``largest`` bytes (one at a time held one task's).
    A distance on many features is a few LAPACK calls on d × d matrices, which leave Python's lock while they compute
    and run faster one thread each, two at a time, than one at a time on two threads (Fashion-MNIST's Γ with its
    references and Γ(x|y): 28.9 → 25.1 s on 2 cores)."""
    with one_blas_thread() as threads:
        workers = 1
        if d >= PARALLEL_FROM_FEATURES:  # the memory read only where it may be used
            room = available_memory()
            workers = min(threads, len(tasks), threads if room is None else room // (2 * largest))
        if workers < 2:
            return [task() for task in tasks]
        with ThreadPoolExecutor(workers) as side_by_side:
            return list(side_by_side.map(lambda task: task(), tasks))


def _batched_distances(p: Pool, clients: list[np.ndarray]) -> list[float]:
    """:func:`_client_distance` of every client of ``clients`` in a few stacked numpy calls; none has more samples
    than features, and one at least has some. Such clients — Γ(x|y)'s classes, a size-matched reference's draws — cost
    numpy's per-call overhead, not arithmetic: one client at a time, Γ(x|y) took 54 ms on the default experiment,
    21 ms so.

    Each client's rows are padded with zero rows to the largest client's count, which leaves their sums, ``XᵀX`` and
    covariance factor F as they are; the cross term is :func:`frechet_from_factor`'s (the eigenvalues of F Σ_o Fᵀ),
    F Σ_o Fᵀ made from the pool's statistics without any client's d × d Σ_o."""
    d = len(p.centre)
    sizes = np.array([len(c) for c in clients])
    width = int(sizes.max())
    owner = np.repeat(np.arange(len(clients)), sizes)
    slot = np.arange(len(owner)) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    rows = np.zeros((len(clients), width, d))
    rows[owner, slot] = p.rows(np.concatenate(clients))
    n_k, n_o = sizes.astype(np.float64), (p.n_total - sizes).astype(np.float64)
    sum_k = rows.sum(axis=1)
    mu_k = sum_k / np.maximum(n_k, 1)[:, None]
    mu_o = (p.total_sum - sum_k) / np.maximum(n_o, 1)[:, None]
    present = np.zeros((len(clients), width, 1))
    present[owner, slot] = 1.0
    factor = (rows - mu_k[:, None, :]) * present / np.sqrt(np.maximum(n_k - 1, 1))[:, None, None]
    scale = 1 / np.maximum(n_o - 1, 1)  # Σ_o = (XXᵀ_all − X_kᵀX_k − n_o μ_o μ_oᵀ) · scale
    trace_o = (np.trace(p.total_xx) - np.einsum("krd,krd->k", rows, rows)
               - n_o * np.einsum("kd,kd->k", mu_o, mu_o)) * scale
    f_mu = np.einsum("krd,kd->kr", factor, mu_o)  # the non-zero eigenvalues of Σ_k Σ_o are F Σ_o Fᵀ's
    f_rows = factor @ rows.transpose(0, 2, 1)
    inner = ((factor.reshape(-1, d) @ p.total_xx).reshape(factor.shape) @ factor.transpose(0, 2, 1)
             - f_rows @ f_rows.transpose(0, 2, 1) - n_o[:, None, None] * f_mu[:, :, None] * f_mu[:, None, :])
    inner *= scale[:, None, None]
    cross = _root_trace(inner)
    diff = mu_k - mu_o
    value = np.einsum("kd,kd->k", diff, diff) + np.einsum("krd,krd->k", factor, factor) + trace_o - 2 * cross
    return np.maximum(value, 0.0).tolist()


def _extrapolated(p: Pool, idx: np.ndarray, rng: np.random.Generator) -> float:
    """FD∞ for one client: distances of nested subsamples fitted linearly in 1/n, read at 1/n = 0.

    The "others" stay the same set (the client's held-out part is not moved to them).
    """
    order = rng.permutation(len(idx))  # positions in idx: the subsamples are rows of xc_all, read once
    xc_all = p.rows(idx)
    n_o = p.n_total - len(idx)
    sum_o = p.total_sum - xc_all.sum(axis=0)
    mu_o = sum_o / max(n_o, 1)
    s_o = (p.total_xx - xc_all.T @ xc_all - n_o * np.outer(mu_o, mu_o)) / max(n_o - 1, 1)
    sizes, values = [], []
    for fraction in (0.5, 0.75, 1.0):
        sub = order[: max(2, int(round(fraction * len(idx))))]
        xc = xc_all[sub]
        mu_k = xc.mean(axis=0)
        u = (xc - mu_k).T / np.sqrt(len(sub) - 1)
        values.append(frechet_from_factor(mu_k, u, mu_o + 0.0, s_o))
        sizes.append(len(sub))
    slope, intercept = np.polyfit(1.0 / np.asarray(sizes, float), np.asarray(values), 1)
    return max(float(intercept), 0.0)


def gamma(x: np.ndarray, clients: list[np.ndarray], estimator: str = "plain", pooled: Pool | None = None) -> float:
    """Γ: mean over clients of FD(client's Gaussian, all other clients' pooled Gaussian).

    NaN for fewer than two clients: each client is compared with the others, so Γ is undefined.
    """
    if len(clients) < 2:
        return float("nan")
    return float(np.mean(client_distances(x, clients, estimator=estimator, pooled=pooled)))


def gamma_iid(x: np.ndarray, clients: list[np.ndarray], draws: int = 3, max_clients: int = 100,
              seed: int = 0, estimator: str = "plain", pooled: Pool | None = None) -> tuple[float, float]:
    """Γ of random partitions of the same pool into clients of the same sizes: (mean, sd over draws).

    Each draw scores at most ``max_clients`` randomly chosen clients (an unbiased
    estimate of the mean over all), so the reference costs ``draws × max_clients``
    distances whatever the client count. Every draw re-deals the same samples, so all share one :func:`pool`
    (``pooled``, or computed here once).
    """
    if len(clients) < 2 or draws < 1:
        return float("nan"), float("nan")
    pooled = pooled or pool(x, clients)
    rng = np.random.default_rng([seed, 0x61D])
    sizes = np.array([len(c) for c in clients])
    samples = np.concatenate(clients)
    scored = min(max_clients, len(clients))
    values: list[float] = []
    dealt: list[np.ndarray] = []
    for _ in range(draws):
        shuffled = np.split(rng.permutation(samples), np.cumsum(sizes)[:-1])
        which = sorted(rng.choice(len(clients), scored, replace=False).tolist())
        if estimator == "plain":  # every draw's clients against the one pool: scored together below
            dealt.extend(shuffled[k] for k in which)
        else:  # the extrapolated estimator draws its subsamples from ``rng`` between the draws
            values.append(float(np.mean(client_distances(x, shuffled, which, estimator, rng, pooled))))
    if dealt:
        values = np.mean(np.reshape(np.asarray(client_distances(x, dealt, pooled=pooled)), (draws, scored)),
                         axis=1).tolist()
    return float(np.mean(values)), float(np.std(values, ddof=1)) if draws > 1 else 0.0


def gamma_given_label(x: np.ndarray, y: np.ndarray, clients: list[np.ndarray], n_classes: int, draws: int = 3,
                      max_clients: int = 100, seed: int = 0, estimator: str = "plain") -> tuple[float, float, float]:
    """Γ(x|y), the class-conditional Γ, with its size-matched IID reference: (Γ(x|y), reference mean, its sd).

    Per class c, Γ over the clients holding class-c samples (each client's class-c rows against the other holders'),
    then the mean over the classes at least two clients hold. Where Γ compares P(x), this compares P(x | y): it is
    blind to label skew alone (each class looks alike on every client; label EMD measures that) and sees what Γ
    cannot — the same label drawn differently (rotated images) or the same image labelled otherwise (swapped labels).
    The reference re-deals each class's samples among its holders at the same counts (:func:`gamma_iid` per class);
    its sd is the class mean's, the classes' draws being independent. NaN where no class has two holders."""
    values, refs, sds = [], [], []
    for c in range(n_classes):
        holders = [rows for rows in (idx[y[idx] == c] for idx in clients) if len(rows)]
        if len(holders) < 2:
            continue
        pooled = pool(x, holders)
        values.append(gamma(x, holders, estimator, pooled))
        ref, sd = gamma_iid(x, holders, draws, max_clients, seed * n_classes + c, estimator, pooled)
        refs.append(ref)
        sds.append(sd)
    if not values:
        return float("nan"), float("nan"), float("nan")
    return float(np.mean(values)), float(np.mean(refs)), float(np.sqrt(np.sum(np.square(sds))) / len(sds))


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
    """Per client: Σ_c |p_k(c) − p(c)| against the pooled label distribution (0 … 2).

    This is Zhao et al.'s (2018) "EMD"; under the 0/1 ground metric the earth
    mover's distance proper (total variation) is half of it.
    """
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
    gamma_iid: float = float("nan")  # Γ of size-matched IID partitions (mean over draws)
    gamma_iid_sd: float = float("nan")
    measured_on: str = "train"  # which of each client's samples Γ is measured on
    estimator: str = "plain"
    #: Γ(x|y), the class-conditional Γ (:func:`gamma_given_label`), and its size-matched IID reference
    gamma_given_label: float = float("nan")
    gamma_given_label_iid: float = float("nan")
    gamma_given_label_iid_sd: float = float("nan")
    #: False: Γ was not measured (``heterogeneity.gamma: false``), only the label-skew figures
    gamma_measured: bool = True

    @property
    def gamma_excess(self) -> float:
        """Γ − Γ_IID: heterogeneity beyond what client size alone produces."""
        return self.gamma - self.gamma_iid

    def as_dict(self) -> dict:
        def num(v: float) -> float | None:  # JSON has no NaN: "not measured" is null
            return None if np.isnan(v) else float(v)

        return {
            "gamma": num(self.gamma),
            "gamma_measured": self.gamma_measured,
            "gamma_iid": num(self.gamma_iid),
            "gamma_iid_sd": num(self.gamma_iid_sd),
            "gamma_excess": num(self.gamma_excess),
            "gamma_measured_on": self.measured_on,
            "gamma_estimator": self.estimator,
            "gamma_given_label": num(self.gamma_given_label),
            "gamma_given_label_iid": num(self.gamma_given_label_iid),
            "gamma_given_label_iid_sd": num(self.gamma_given_label_iid_sd),
            "gamma_given_label_excess": num(self.gamma_given_label - self.gamma_given_label_iid),
            "label_emd_mean": num(self.label_emd_mean),
            "js_mean": num(self.js_mean),
            "label_emd": self.label_emd,
        }


def gamma_line(h: dict) -> str:
    """One line for people: Γ, its size-matched IID reference and the excess, and what Γ was measured on."""
    def f(v):
        return "-" if v is None or (isinstance(v, float) and np.isnan(v)) else f"{v:.4f}"

    if h.get("gamma_measured") is False:
        return "Γ = —   (not measured: heterogeneity.gamma = false)"
    if h.get("gamma") is None or (isinstance(h.get("gamma"), float) and np.isnan(h["gamma"])):
        return ("Γ = —   (undefined for a single client: Γ compares each client's data with the other clients'; "
                "use partition.clients ≥ 2)")
    ref = f(h.get("gamma_iid"))
    if h.get("gamma_iid_sd") is not None and ref != "-":
        ref += f" ± {h['gamma_iid_sd']:.4f}"
    return (f"Γ = {f(h.get('gamma'))}   Γ_IID (same client sizes) = {ref}   ΔΓ = Γ − Γ_IID = {f(h.get('gamma_excess'))}"
            f"   (measured on each client's {h.get('gamma_measured_on', 'train')} data, "
            f"{h.get('gamma_estimator', 'plain')})")


def gamma_given_label_line(h: dict) -> str | None:
    """Γ(x|y)'s line beside :func:`gamma_line` (None where it was not measured: older runs, one client, no class
    held by two clients)."""
    value = h.get("gamma_given_label")
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    ref, sd = h.get("gamma_given_label_iid"), h.get("gamma_given_label_iid_sd")
    excess = h.get("gamma_given_label_excess")
    shown = "-" if ref is None else f"{ref:.4f}" + ("" if sd is None else f" ± {sd:.4f}")
    return (f"Γ(x|y) = {value:.4f}   Γ(x|y)_IID = {shown}   ΔΓ(x|y) = {'-' if excess is None else f'{excess:.4f}'}"
            "   (per class, across its clients: sees concept shift, not label skew)")


def measure(x: np.ndarray, y: np.ndarray, clients: list[np.ndarray], n_classes: int, *,
            iid_draws: int = 3, iid_max_clients: int = 100, estimator: str = "plain",
            measured_on: str = "train", seed: int = 0, given_label: bool = True, of_features: bool = True
            ) -> Heterogeneity:
    """Γ (and its size-matched IID reference) on the features plus the label-skew figures; with ``given_label``,
    Γ(x|y) and its reference too (:func:`with_given_label`); without ``of_features``, the label-skew figures only."""
    counts = class_histograms(y, clients, n_classes)
    emd = label_emd(counts)
    p, q = _distributions(counts)
    js = [js_divergence(row, q) for row in p]
    labels = {"label_emd": [float(v) for v in emd], "label_emd_mean": float(emd.mean()), "js_mean": float(np.mean(js)),
              "class_counts": counts.tolist(), "measured_on": measured_on, "estimator": estimator}
    if not of_features:
        return Heterogeneity(gamma=float("nan"), gamma_measured=False, **labels)
    pooled = pool(x, clients) if len(clients) >= 2 else None
    ref, ref_sd = gamma_iid(x, clients, iid_draws, iid_max_clients, seed, estimator, pooled)
    het = Heterogeneity(gamma=gamma(x, clients, estimator, pooled), gamma_iid=ref, gamma_iid_sd=ref_sd, **labels)
    return with_given_label(het, x, y, clients, n_classes, iid_draws=iid_draws, iid_max_clients=iid_max_clients,
                            estimator=estimator, seed=seed) if given_label else het


def with_given_label(het: Heterogeneity, x: np.ndarray, y: np.ndarray, clients: list[np.ndarray], n_classes: int, *,
                     iid_draws: int = 3, iid_max_clients: int = 100, estimator: str = "plain", seed: int = 0
                     ) -> Heterogeneity:
    """``het`` with Γ(x|y) and its size-matched IID reference (:func:`gamma_given_label`; undefined, NaN, for one
    client): apart from :func:`measure` so that its caller can time it (on Fashion-MNIST most of Γ's time)."""
    if len(clients) < 2:
        return het
    given, given_ref, given_sd = gamma_given_label(x, y, clients, n_classes, iid_draws, iid_max_clients, seed,
                                                   estimator)
    return replace(het, gamma_given_label=given, gamma_given_label_iid=given_ref, gamma_given_label_iid_sd=given_sd)
