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

from collections.abc import Sequence
from typing import cast

import numpy as np
import numpy.typing as npt
import torch

# purposes, so streams for different jobs never coincide
SAMPLING, CLIENT_ROUND, CLIENT_INIT, SERVER_INIT, SERVER_ROUND = 1, 2, 3, 4, 5
EVAL_SAMPLE, GLOBAL_TEST = 21, 22  # which clients / global test samples an evaluation scores
DROPOUT, STRAGGLER, ATTACKERS, DP_NOISE = 31, 32, 33, 34  # faults, malicious clients, privacy noise
CLOCK, ASYNC_DISPATCH = 35, 36  # the simulated clock's client speeds; which idle client an async server starts
QUANTISE = 42  # a compressor's stochastic rounding of a client's update (hetfed.server.compression)
# a second pass over a client's data in one round (FedRep's body after its head, Ditto's personal model)
LOCAL_PHASE = 41
DATASTORE = 43  # which training samples a client keeps in its kNN-Per datastore when it holds more than its capacity
LEAKAGE = 44  # which samples a membership attack queries, and an inversion's random start (hetfed.runs.leakage)
BUCKETS = 45  # how a round's updates are shuffled into buckets before a robust rule (hetfed.server.buckets)
COMBINE_NOISE = 46  # the noise a combine rule adds to its aggregate (FLAME's; hetfed.server.combine)
ROOT_ROUND = 47  # the batches of the server's training on its root set in a round (FLTrust's; hetfed.engine.root)


def derive_seed(*parts: int) -> int:
    """A 63-bit seed from integer parts (order matters)."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(2, np.uint64)[0] >> 1)


# NumPy's SeedSequence (numpy/random/bit_generator.pyx): its hash constants and entropy pool size
_INIT_A, _MULT_A, _INIT_B, _MULT_B = 0x43B0D7E5, 0x931E8875, 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R, _POOL = 0xCA01F9DD, 0x4973F715, 4
_M32, _SHIFT = np.uint64(0xFFFFFFFF), np.uint64(16)


def _words(value: int) -> list[int]:
    """SeedSequence's 32-bit words of a non-negative int (little end first; 0 is one word)."""
    if value < 0:
        raise ValueError(f"a seed part must be non-negative, got {value}")
    out = [value & 0xFFFFFFFF]
    while value >> 32:
        value >>= 32
        out.append(value & 0xFFFFFFFF)
    return out


_U64 = npt.NDArray[np.uint64]

#: from this many rows :func:`derive_seeds` hashes them at once (where the arrays' fixed cost is paid back)
AT_ONCE_FROM = 16


def derive_seeds(rows: Sequence[Sequence[int]]) -> list[int]:
    """:func:`derive_seed` of every row of parts, hashed for all rows at once: NumPy's SeedSequence algorithm
    (``SeedSequence(parts).generate_state(2, np.uint64)[0] >> 1``) on arrays of uint32 words, the same seeds
    (tested against NumPy's class). One by one a seed costs ~10 µs on this project's CPU (1.0 ms for a 100-client
    round, against a W1 round of 15 ms on an H100); at once, ~0.12 ms plus ~1.7 µs a row, so below
    :data:`AT_ONCE_FROM` rows the rows go one by one. Rows with as many 32-bit words share one pass; rows of as many
    parts that are each one word (a round's clients: run seed, purpose, round, client id) become the words' array
    in one conversion instead of a Python loop over every part (~0.4 ms a round of a 20-seed stacked sweep)."""
    if len(rows) < AT_ONCE_FROM:
        return [derive_seed(*row) for row in rows]
    one_word = _one_word_parts(rows)
    if one_word is not None:
        return cast(list[int], _seeds(one_word, len(one_word)).tolist())
    out = [0] * len(rows)
    groups: dict[int, list[tuple[int, list[int]]]] = {}
    for i, row in enumerate(rows):
        words = [w for p in row for w in _words(int(p))]
        groups.setdefault(len(words), []).append((i, words))
    for n, members in groups.items():
        seeds = _seeds(np.array([w for _, w in members], dtype=np.uint64).T, n)  # [words, rows]
        for (i, _), seed in zip(members, seeds.tolist(), strict=True):
            out[i] = seed
    return out


def _one_word_parts(rows: Sequence[Sequence[int]]) -> _U64 | None:
    """The rows' words ``[parts, rows]`` when every row has as many parts and each part is one 32-bit word (0 ≤ p <
    2³²); else None (rows of other lengths or parts go word by word, a negative part is refused there)."""
    try:
        parts = np.array(rows, dtype=np.int64)
    except (ValueError, OverflowError, TypeError):
        return None
    if parts.ndim != 2 or not parts.size or parts.min() < 0 or parts.max() > 0xFFFFFFFF:
        return None
    return parts.T.astype(np.uint64)


def _seeds(entropy: _U64, n: int) -> _U64:
    """The seed of each column of ``entropy`` ``[n words, rows]``: the first uint64 of ``generate_state``, its two
    low-end uint32 words, shifted right by one."""
    pool = _mixed_pool(entropy, n)
    state, h = [], _INIT_B
    for i in range(2):
        v = pool[i] ^ np.uint64(h)
        h = (h * _MULT_B) & 0xFFFFFFFF
        v = (v * np.uint64(h)) & _M32
        state.append(v ^ (v >> _SHIFT))
    seeds: _U64 = (state[0] | (state[1] << np.uint64(32))) >> np.uint64(1)
    return seeds


def _mixed_pool(entropy: _U64, n: int) -> list[_U64]:
    """SeedSequence's ``mix_entropy`` of ``n`` words per row (``entropy`` [n, rows]): its four pool words. The hash
    constant's sequence does not depend on the data, so it is a scalar for every row."""
    h = _INIT_A

    def hashmix(value: _U64) -> _U64:
        nonlocal h
        value = value ^ np.uint64(h)
        h = (h * _MULT_A) & 0xFFFFFFFF
        value = (value * np.uint64(h)) & _M32
        return value ^ (value >> _SHIFT)

    def mix(x: _U64, y: _U64) -> _U64:
        r: _U64 = (x * np.uint64(_MIX_L) - y * np.uint64(_MIX_R)) & _M32
        return r ^ (r >> _SHIFT)

    zeros = np.zeros(entropy.shape[1], np.uint64)
    pool = [hashmix(entropy[i] if i < n else zeros) for i in range(_POOL)]
    for src in range(_POOL):
        for dst in range(_POOL):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for src in range(_POOL, n):
        for dst in range(_POOL):
            pool[dst] = mix(pool[dst], hashmix(entropy[src]))
    return pool


def numpy_rng(*parts: int) -> np.random.Generator:
    return np.random.default_rng(derive_seed(*parts))


def torch_gen(*parts: int) -> torch.Generator:
    return torch.Generator().manual_seed(derive_seed(*parts))
