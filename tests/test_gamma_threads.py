"""Γ computed one BLAS thread a distance (and, on many features, distances side by side): the same number whatever
the BLAS's threads, side by side or one after another, from several threads at once; the BLAS's own thread count
given back, even when a distance fails."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from threadpoolctl import threadpool_info, threadpool_limits

import hetfed.heterogeneity as het


def _blas_threads() -> list[int]:
    return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]


def _clients(d: int, n: int = 3_000, k: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """``n`` rows of ``d`` features in 3 classes, dealt to ``k`` clients of unequal sizes, some larger than ``d``
    (each computed alone) and some smaller (batched)."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = (rng.normal(size=(n, d)) + y[:, None] * rng.normal(size=d)).astype(np.float32)
    sizes = np.cumsum(rng.dirichlet([0.6] * k) * n).astype(int)[:-1]
    return x, y, np.split(rng.permutation(n), sizes)


def _measured(x: np.ndarray, y: np.ndarray, clients: list[np.ndarray], **kw: object) -> tuple[float, ...]:
    h = het.measure(x, y, clients, 3, iid_draws=2, **kw)  # type: ignore[arg-type]
    return h.gamma, h.gamma_iid, h.gamma_iid_sd, h.gamma_given_label, h.gamma_given_label_iid


def test_gamma_is_the_same_number_with_the_blas_on_one_thread_or_two() -> None:
    """LAPACK's symmetric eigensolvers round by their thread count: before each distance had one thread, the
    default experiment's Γ_IID moved in its 10th digit between one BLAS thread and two — this compares to the bit."""
    from hetfed.config import load_config
    from hetfed.pipeline import prepare

    config = load_config(None, [])
    fed, h = prepare(config, progress=False).federation, config.heterogeneity
    clients = [fed.measured_rows(k, h.on) for k in range(fed.n_clients)]
    found = {}
    for threads in (1, 2):
        with threadpool_limits(limits=threads, user_api="blas"):
            found[threads] = _measured(fed.x, fed.y, clients, seed=config.seed)
    assert found[1] == found[2]


@pytest.mark.parametrize("estimator", ["plain", "extrapolated"])
def test_gamma_on_many_features_is_the_same_number_with_the_blas_on_one_thread_or_two(estimator: str) -> None:
    """The pool's ``XᵀX`` (3 000 × 140 here) rounded by the BLAS's thread count (2.7e-12 apart) while each distance
    had one thread: Γ moved in its 14th digit and the extrapolated Γ(x|y) in its 9th between a process whose BLAS
    had one thread and one with two — and the side-by-side test below failed in a suite where an earlier test had
    left the BLAS on one thread. Now the pool's product has one thread too."""
    x, y, clients = _clients(d=140)
    found = {}
    for threads in (1, 2):
        with threadpool_limits(limits=threads, user_api="blas"):
            found[threads] = _measured(x, y, clients, estimator=estimator)
    assert found[1] == found[2]


@pytest.mark.parametrize("estimator", ["plain", "extrapolated"])
def test_side_by_side_gives_the_numbers_one_after_another_gives(estimator: str,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    x, y, clients = _clients(d=140)
    monkeypatch.setattr(het, "PARALLEL_FROM_FEATURES", 1 << 62)
    alone = _measured(x, y, clients, estimator=estimator)
    monkeypatch.setattr(het, "PARALLEL_FROM_FEATURES", 1)
    with threadpool_limits(limits=2, user_api="blas"):
        assert _measured(x, y, clients, estimator=estimator) == alone
    assert all(np.isfinite(alone)) and alone[0] > 0


def test_two_threads_measuring_at_once_get_the_numbers_each_gets_alone() -> None:
    cases = [_clients(d=140, seed=s) for s in (1, 2)]
    alone = [_measured(*case) for case in cases]
    before = _blas_threads()
    found: list[tuple[float, ...] | None] = [None, None]

    def measure(i: int) -> None:
        found[i] = _measured(*cases[i])

    threads = [threading.Thread(target=measure, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert found == alone and _blas_threads() == before


def test_the_blas_gets_its_threads_back_when_a_distance_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    x, _, clients = _clients(d=140)
    before = _blas_threads()

    def fails(*_: object) -> float:
        assert _blas_threads() and set(_blas_threads()) == {1}  # computed on one BLAS thread
        raise FloatingPointError("a distance failed")

    monkeypatch.setattr(het, "_client_distance", fails)
    with pytest.raises(FloatingPointError, match="a distance failed"):
        het.gamma(x, clients)
    assert _blas_threads() == before


def test_distances_go_side_by_side_only_as_far_as_the_memory_left_holds_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """Side by side, each task holds its client's rows at once: as many at a time as half the memory still
    available holds, and one after another (no thread started) where it holds one."""
    x, _, clients = _clients(d=140)
    started: list[int] = []

    class Counted(het.ThreadPoolExecutor):  # type: ignore[misc]
        def __init__(self, workers: int) -> None:
            started.append(workers)
            super().__init__(workers)

    monkeypatch.setattr(het, "ThreadPoolExecutor", Counted)
    monkeypatch.setattr(het, "PARALLEL_FROM_FEATURES", 1)
    with threadpool_limits(limits=2, user_api="blas"):
        plenty = het.gamma(x, clients)
        assert started and max(started) == 2
        started.clear()
        monkeypatch.setattr(het, "available_memory", lambda: 8 * 140 * 140)  # less than two tasks' d × d's
        assert het.gamma(x, clients) == plenty and not started
