"""Privacy accounting for client-level DP-FedAvg, by Google's ``dp-accounting`` library.

Each aggregated round is one Gaussian mechanism (noise multiplier z, relative to the
clip bound S) applied to a subsample of the clients. hetfed samples a fixed number
m of the N eligible clients per round; the accountant models it as Poisson
sampling with q = m / N — the approximation TensorFlow Privacy, TFF and Flower's
DP examples make for DP-FedAvg. With q = 1 (every client, every round) there is
no amplification and the rounds compose plain Gaussian mechanisms.
"""

from __future__ import annotations

import logging
import math
from functools import lru_cache
from typing import Any

from hetfed.errors import ConfigError


def _library() -> tuple[Any, Any]:
    try:
        import dp_accounting
        from dp_accounting.rdp import rdp_privacy_accountant
    except ImportError:
        raise ConfigError(
            "privacy.noise_multiplier is set but the accountant library is not installed: expected "
            "`pip install dp-accounting` (or `pip install 'hetfed[privacy]'`)"
        ) from None
    logging.getLogger("absl").setLevel(logging.ERROR)  # it warns about orders it skips; ε is still an upper bound
    return dp_accounting, rdp_privacy_accountant


def check_available() -> None:
    """Fail before any training when DP is asked for but the accountant is missing."""
    _library()


@lru_cache(maxsize=4096)
def epsilon(noise_multiplier: float, sample_rate: float, rounds: int, delta: float) -> float:
    """ε after ``rounds`` aggregated rounds, for ``delta`` (RDP accountant; inf when z = 0)."""
    if rounds <= 0:
        return 0.0
    if noise_multiplier <= 0:
        return math.inf
    dp_accounting, rdp = _library()
    event = dp_accounting.GaussianDpEvent(noise_multiplier)
    if sample_rate < 1.0:
        event = dp_accounting.PoissonSampledDpEvent(sample_rate, event)
    accountant = rdp.RdpAccountant()
    accountant.compose(event, rounds)
    return float(accountant.get_epsilon(delta))
