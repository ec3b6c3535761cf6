"""``uniform``: each client's speed uniform in [1 − spread/2, 1 + spread/2] × the median."""

from hetfed.engine.latency import LatencyModel, SpreadParams, register

register(LatencyModel("uniform", "each client's speed uniform in [1 − spread/2, 1 + spread/2]·median", SpreadParams,
                      lambda p, n, rng: 1.0 + p.spread * (rng.random(n) - 0.5)))
