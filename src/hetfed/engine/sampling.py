"""Which clients take part in a round.

Opted-out clients are never sampled (their data must never influence the global
model). A fixed count ``m`` (``clients_per_round``) is kept fixed when clients opt
out, as FedMoE does; a fraction ``C`` (``client_fraction``) is taken of the
opted-in clients, at least one.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hetfed.config import TrainConfig
from hetfed.engine.rng import EVAL_SAMPLE, SAMPLING, numpy_rng
from hetfed.errors import ConfigError


def clients_per_round(cfg: TrainConfig, n_eligible: int) -> int:
    """How many clients a round samples; a fixed m that cannot be met is an error, not clamped."""
    if n_eligible == 0:
        raise ConfigError("partition.opt_out leaves no opted-in client to train the global model")
    if cfg.clients_per_round is not None:
        if cfg.clients_per_round > n_eligible:
            raise ConfigError(
                f"train.clients_per_round = {cfg.clients_per_round} is not allowed: only {n_eligible} clients "
                f"are opted in; expected ≤ {n_eligible} (or use train.client_fraction)"
            )
        return cfg.clients_per_round
    return max(1, int(round((cfg.client_fraction or 1.0) * n_eligible)))


def sample_clients(cfg: TrainConfig, opted_out: np.ndarray, seed: int, round: int,
                   select: Callable[[np.ndarray, int, np.random.Generator],
                                    list[int] | None] | None = None) -> list[int]:
    """Sorted ids of this round's clients, from a stream of (seed, round).

    ``select(eligible, m, rng)``: the algorithm's own choice (AFL's valuations); when it
    is absent or returns None, m clients are drawn uniformly.
    """
    eligible = np.flatnonzero(~np.asarray(opted_out, dtype=bool))
    m = clients_per_round(cfg, len(eligible))
    if m == len(eligible):
        return eligible.tolist()
    rng = numpy_rng(seed, SAMPLING, round)
    chosen = select(eligible, m, rng) if select is not None else None
    if chosen is not None:
        return sorted(int(k) for k in chosen)
    return sorted(rng.choice(eligible, size=m, replace=False).tolist())


def eval_sample(cfg: TrainConfig, n_clients: int, seed: int) -> list[int] | None:
    """The clients scored at every evaluation: a fixed random sample of ``eval_clients`` (None: all).

    Fixed for the whole run, so successive evaluations (and the best-model choice)
    compare the same clients.
    """
    if cfg.eval_clients is None or cfg.eval_clients >= n_clients:
        return None
    rng = numpy_rng(seed, EVAL_SAMPLE, 0)
    return sorted(rng.choice(n_clients, size=cfg.eval_clients, replace=False).tolist())


def global_scorers(cfg: TrainConfig, ids: list[int], seed: int, among: list[int] | None = None) -> list[bool] | None:
    """Which of ``ids`` also score the global test set with a personal model: at most
    ``eval_global_clients`` of the evaluated clients ``among`` (default ``ids``), the same ones
    at every evaluation and however the clients are chunked (None: all of them)."""
    pool = list(ids if among is None else among)
    n = cfg.eval_global_clients
    if n is None or n >= len(pool) or not ids:
        return None
    rank = numpy_rng(seed, EVAL_SAMPLE, 1).random(max(pool) + 1)
    chosen = set(np.asarray(pool)[np.argsort(rank[pool], kind="stable")[:n]].tolist())
    return [k in chosen for k in ids]
