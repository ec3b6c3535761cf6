"""``exponential``: each client's speed drawn from an exponential distribution with median 1 × the median."""

import numpy as np

from hetfed.engine.latency import LatencyModel, register

register(LatencyModel("exponential", "each client's speed drawn from an exponential with the median",
                      multipliers=lambda p, n, rng: rng.exponential(1.0 / np.log(2.0), n)))
