"""Random streams derived from the run seed, never from execution order.

Every (round, client, purpose) gets its own seed from ``numpy.random.SeedSequence``
so that a client's batches and dropout masks are the same whether it trains
alone (sequential executor), stacked with others (vectorised) or on a device.
Within a round, a client's seed keys the counter-based streams its local training
draws on the device (:mod:`hetfed.streams`); the server's and the algorithms' own
draws (initialisation, sampling, DP noise, generated samples) use these seeds on
the host.
"""

from __future__ import annotations

import numpy as np
import torch

# purposes, so streams for different jobs never coincide
SAMPLING, CLIENT_ROUND, CLIENT_INIT, SERVER_INIT, SERVER_ROUND = 1, 2, 3, 4, 5
EVAL_SAMPLE, GLOBAL_TEST = 21, 22  # which clients / global test samples an evaluation scores
DROPOUT, STRAGGLER, ATTACKERS, DP_NOISE = 31, 32, 33, 34  # faults, malicious clients, privacy noise
CLOCK, ASYNC_DISPATCH = 35, 36  # the simulated clock's client speeds; which idle client an async server starts
QUANTISE = 42  # a compressor's stochastic rounding of a client's update (hetfed.server.compression)
LOCAL_PHASE = 41  # a second pass over a client's data in one round (FedRep's body after its head, Ditto's personal model)
DATASTORE = 43  # which training samples a client keeps in its kNN-Per datastore when it holds more than its capacity


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integer parts (order matters)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint64)[0] >> 1)


def numpy_rng(*parts: int) -> np.random.Generator:
    return np.random.default_rng(derive_seed(*parts))


def torch_gen(*parts: int) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(*parts))
