"""Which clients take part in a round.

Opted-out clients are never sampled (their data must never influence the global
model). A fixed count ``m`` (``clients_per_round``) is kept fixed when clients opt
out, as FedMoE does; a fraction ``C`` (``client_fraction``) is taken of the
opted-in clients, at least one.
"""

from __future__ import annotations

import numpy as np

from hetfed.config import TrainConfig
from hetfed.engine.rng import SAMPLING, numpy_rng
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


def sample_clients(cfg: TrainConfig, opted_out: np.ndarray, seed: int, round: int) -> list[int]:
    """Sorted ids of this round's clients, from a stream of (seed, round)."""
    eligible = np.flatnonzero(~np.asarray(opted_out, dtype=bool))
    m = clients_per_round(cfg, len(eligible))
    if m == len(eligible):
        return eligible.tolist()
    rng = numpy_rng(seed, SAMPLING, round)
    return sorted(rng.choice(eligible, size=m, replace=False).tolist())
