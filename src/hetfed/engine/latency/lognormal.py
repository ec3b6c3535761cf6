"""``lognormal``: each client's speed exp(σ·N(0, 1)) × the median (σ = ``spread``)."""

import numpy as np

from hetfed.engine.latency import LatencyModel, SpreadParams, register

register(LatencyModel("lognormal", "each client's speed drawn lognormal around the median (σ = spread)", SpreadParams,
                      lambda p, n, rng: np.exp(p.spread * rng.standard_normal(n))))
