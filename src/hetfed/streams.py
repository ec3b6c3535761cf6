"""Counter-based random numbers computed on the device: a pure function of (key, counters).

A stack of clients draws its batch orders and dropout masks as tensor operations, for every client
at once: the value at (client seed, purpose, step, position …) is a hash of those integers, so it needs
no per-client generator, no Python loop over the stack and no copy from the host; it does not depend
on which clients share the stack (or on how many draws came before it), and it is the same integer on
every device (CPU and CUDA run the same integer arithmetic; no float is involved until the last step,
an exact scaling of 24 bits).

The mixing function is Wellons' ``lowbias32`` (a 32-bit integer hash with a full avalanche), applied
once per counter, in int64 tensors whose values stay in [0, 2³²): integer arithmetic, exact everywhere
(:func:`_mul32` says why its wrapping product is too).

Why not torch's own generators: ``torch.Generator`` is a sequential stream per object (one per client, in
a Python loop, on the host for CPU generators); CUDA's Philox offsets depend on the kernel that draws.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple, TypeVar

import numpy as np
import torch

#: recorded in every run directory's environment and checkpoint: which generator drew the run's client streams
#: (run directories without it were drawn by per-client host generators, hetfed ≤ 0.1). v2: a compressor's draws
#: (QSGD's stochastic rounding) are counter-based too.
GENERATOR = "counter-lowbias32-v2"
#: earlier generators whose compressors drew otherwise: a resume of a run with such a compressor is refused
COMPRESSOR_DRAWS_CHANGED = {"counter-lowbias32-v1": "QSGD's rounding drawn from a PCG64 host generator per client"}

MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9
# purposes within one client's round stream (the key already separates rounds, clients and phases)
BATCH_ORDER, DROPOUT_MASK, MODEL_DRAW = 1, 2, 3
#: integer arrays the hashes take: torch tensors on any device, or numpy arrays (a CPU round's batch orders)
Ints = TypeVar("Ints", torch.Tensor, np.ndarray)


def _mul32(x: Ints, c: int) -> Ints:
    """``x · c mod 2³²`` for x, c in [0, 2³²): the int64 product's low 32 bits.

    The product can pass 2⁶³: int64 multiplication wraps modulo 2⁶⁴ on every device torch runs on (x86/ARM
    CPUs, CUDA), and the low 32 bits of the wrapped product are the true ones. Splitting ``c`` in 16-bit
    halves avoids the wrap but costs 3.5× (the dropout masks of a 50-client stack: most of a step).
    """
    return (x * c) & MASK32


def mix32(x: Ints) -> Ints:
    """Wellons' lowbias32 of every element (int64 values in [0, 2³²)): a torch tensor, or a numpy array (whose int64
    products wrap as torch's do)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def keys(seeds: Sequence[int], device: torch.device | str) -> torch.Tensor:
    """Each client's 64-bit round seed folded into a 32-bit key ``[n]`` (int64), on ``device``: its low 32 bits
    xor the hashed high ones (so seeds that differ only there still give unrelated keys). Hashed on the host
    (numpy: a few operations on ``n`` values, each ~1 µs there against a torch call's ~4 µs or a kernel launch) and
    copied once; the same integers as :func:`mix32` on any device."""
    low = np.array([int(s) & MASK32 for s in seeds], dtype=np.int64)
    high = np.array([(int(s) >> 32) & MASK32 for s in seeds], dtype=np.int64)
    return torch.from_numpy(low ^ mix32(high)).to(device, non_blocking=True)  # a blocking copy waits on the GPU


def bits(key: Ints, *counters: Ints | int) -> Ints:
    """32 random bits (int64 in [0, 2³²)) at ``counters`` of the stream ``key``; shapes broadcast."""
    h = mix32((key & MASK32) ^ _GOLDEN)
    for c in counters:
        h = mix32(((h ^ (c & MASK32)) + _GOLDEN) & MASK32)
    return h


#: the int32 two's-complement forms of the constants (:func:`next32`)
_I32 = 1 << 32
_GOLDEN_I32 = _GOLDEN - _I32
_MUL1_I32, _MUL2_I32 = 0x7FEB352D, 0x846CA68B - _I32
_SIGN_I32 = -(1 << 31)


def _to_int32(x: torch.Tensor) -> torch.Tensor:
    """int64 values in [0, 2³²) as int32 tensors of the same 32 bits (two's complement)."""
    return torch.where(x >= 1 << 31, x - _I32, x).to(torch.int32)


def _mix32_int32_(x: torch.Tensor) -> torch.Tensor:
    """:func:`mix32` on the 32 bits of every element of an int32 tensor, in place. An int32 product wraps modulo
    2³² (two's complement, on every device torch runs on), and ``(x >> k) & (2^(32−k) − 1)`` is the logical shift
    of the arithmetic one int32 tensors have."""
    x ^= (x >> 16).bitwise_and_(0xFFFF)
    x *= _MUL1_I32
    x ^= (x >> 15).bitwise_and_(0x1FFFF)
    x *= _MUL2_I32
    x ^= (x >> 16).bitwise_and_(0xFFFF)
    return x


def seeded32(key: torch.Tensor) -> torch.Tensor:
    """The state of stream ``key`` before its first counter, as int32: what :func:`next32` hashes counters with."""
    return _to_int32(mix32((key & MASK32) ^ _GOLDEN))


def next32(state: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """The 32 bits (int32) at ``counter`` (values in [0, 2³¹)) of the stream in ``state`` (:func:`seeded32`):
    ``next32(seeded32(key), counter)`` is ``bits(key, counter)``, the same 32 bits in two's complement.

    The form for a large draw (a stack's dropout masks): int32 arithmetic in place costs ~0.4× the int64 form on
    this project's CPU — CPUs multiply int32 lanes in SIMD where int64 products are scalar without AVX-512, and
    the arrays are half the size. Compare with :func:`at_least`; tested equal to :func:`bits`.
    """
    x = state ^ counter.to(torch.int32)
    x += _GOLDEN_I32
    return _mix32_int32_(x)


class RoundDraws:
    """The states (:func:`seeded32`) of each client's draws of ``purpose`` at every step of a round, ``[n]`` per
    (step, draw): ``seeded32(bits(keys, purpose, step, draw))``.

    Why a table: a state is five hashes of a few values — about fifty tensor operations too small to cost
    anything but their launch. A step's first ``draws`` draws are read from a table hashed for every step of the
    round at once, on first use; other draws, and a step given as a device tensor (a recorded step), are hashed
    when asked. The same numbers either way.
    """

    def __init__(self, keys: torch.Tensor, steps: int, purpose: int, draws: int = 4) -> None:
        self.keys, self.steps, self.purpose, self.draws = keys, steps, purpose, draws
        self._table: torch.Tensor | None = None
        self._whole: RoundDraws | None = None  # the stack this is the first clients of (its table is shared)

    def head(self, clients: int) -> RoundDraws:
        """The draws of the stack's first ``clients`` clients (a step that computes only those): the same numbers,
        read from this stack's table."""
        part = RoundDraws(self.keys[:clients], self.steps, self.purpose, self.draws)
        part._whole = self
        return part

    def state(self, step: int | torch.Tensor, draw: int) -> torch.Tensor:
        if isinstance(step, int) and 0 <= step < self.steps and draw < self.draws:
            if self._whole is not None:
                return self._whole.state(step, draw)[: len(self.keys)]
            if self._table is None:
                device = self.keys.device
                self._table = seeded32(bits(self.keys[:, None, None], self.purpose,
                                            torch.arange(self.steps, device=device)[None, :, None],
                                            torch.arange(self.draws, device=device)[None, None, :]))
            return self._table[:, step, draw]
        return seeded32(bits(self.keys, self.purpose, step, draw))


def at_least(drawn: torch.Tensor, threshold: int) -> torch.Tensor:
    """Whether each of :func:`next32`'s draws, read as an unsigned 32-bit integer, is ≥ ``threshold`` (in
    [0, 2³²]); ``drawn`` is overwritten (its sign bit flipped, so a signed comparison orders it as unsigned)."""
    if threshold > MASK32:
        return torch.zeros_like(drawn, dtype=torch.bool)
    drawn ^= _SIGN_I32
    return drawn >= threshold + _SIGN_I32


def below(p: float) -> int:
    """The 32-bit threshold under which :func:`bits` falls with probability ``p`` (to 2⁻³²)."""
    return min(1 << 32, round(p * (1 << 32)))


def uniform(key: torch.Tensor, *counters: torch.Tensor | int) -> torch.Tensor:
    """U[0, 1) float32 at ``counters`` of ``key`` (24 bits, exact on every device)."""
    return (bits(key, *counters) >> 8).to(torch.float32) * (1.0 / (1 << 24))


class PermutationLayout(NamedTuple):
    """What :func:`permutations` takes from the sizes and epochs alone (the next round of a run has the same):
    for every flat position, its (client, epoch) segment's slot ``client · n_epochs + epoch``, its position within
    the segment, and the segment's first flat position."""

    slot: torch.Tensor
    position: torch.Tensor
    segment: torch.Tensor
    n_epochs: int


def permutation_layout(sizes: Sequence[int], epochs: Sequence[int],
                       device: torch.device | str) -> PermutationLayout | None:
    """:class:`PermutationLayout` of clients of ``sizes`` positions shuffled ``epochs`` times (None: nothing to
    shuffle)."""
    lengths = [n * e for n, e in zip(sizes, epochs, strict=True)]
    total = sum(lengths)
    if total == 0:
        return None
    size = torch.tensor(sizes, dtype=torch.int64, device=device)
    client = torch.repeat_interleave(torch.arange(len(sizes), device=device),
                                     torch.tensor(lengths, dtype=torch.int64, device=device), output_size=total)
    start = torch.cumsum(torch.tensor([0, *lengths[:-1]], dtype=torch.int64, device=device), 0)
    offset = torch.arange(total, device=device) - start[client]  # e·n + i within the client's block
    n = size[client]
    epoch, position = offset // n, offset % n
    segment = start[client] + epoch * n  # one segment per (client, epoch): its first flat position
    return PermutationLayout(client * max(epochs) + epoch, position, segment, max(epochs))


def permutations(key: torch.Tensor, sizes: Sequence[int], epochs: Sequence[int],
                 layout: PermutationLayout | None = None) -> torch.Tensor:
    """Each client's shuffles of its positions, epoch after epoch, as one flat tensor.

    Client ``k`` (``key[k]``, ``sizes[k]`` positions) gets ``epochs[k]`` permutations of ``0 … sizes[k]−1``;
    the result concatenates them client by client, epoch by epoch (length Σ sizes·epochs). Permutation
    (k, e) sorts the positions by ``bits(bits(key[k], BATCH_ORDER, e), i)`` (ties by position): one stable sort
    of the whole stack, every permutation independent of the others and of the stack. ``layout``: the sizes'
    :func:`permutation_layout`, when the caller kept it. On a CPU the hashing and the sort run in numpy
    (:func:`_positions_hashed`: the same integers and the same stable order, ~25 operations on a few thousand values,
    which cost ~40 µs there against 150 µs as torch calls for a 10-client round, #74).
    """
    device = key.device
    layout = layout if layout is not None else permutation_layout(sizes, epochs, device)
    if layout is None:
        return torch.zeros(0, dtype=torch.int64, device=device)
    if device.type == "cpu":
        on_host = _positions_hashed(key.numpy(), layout.slot.numpy(), layout.position.numpy(), layout.n_epochs)
        order = torch.from_numpy(_stable_order(layout.segment.numpy() * (1 << 32) + on_host))
    else:
        # the (client, epoch) part of the hash on the small tensor of segments, the position's on the flat one
        each_epoch = torch.arange(layout.n_epochs, device=device)
        epoch_keys = bits(key[:, None], BATCH_ORDER, each_epoch[None, :]).reshape(-1)
        hashed = bits(epoch_keys[layout.slot], layout.position)
        order = torch.sort(layout.segment * (1 << 32) + hashed, stable=True).indices
    return order - layout.segment  # position i of the segment's permutation: order stays within its segment


_U32 = np.uint32


def _stable_order(values: np.ndarray) -> np.ndarray:
    """``np.argsort(values, kind="stable")``, by numpy's faster unstable sort where no two values are equal (then
    both orders are the same): 0.32 against 0.71 ms for a 20-seed stacked round's 20 000 positions (2026-12-06,
    2-core Xeon); ties (two positions hashed alike, ~n²/2³³ of them in a segment of n) fall back to the stable sort."""
    order = np.argsort(values)
    ranked = values[order]
    if len(ranked) > 1 and bool((ranked[1:] == ranked[:-1]).any()):
        return np.argsort(values, kind="stable")
    return order


def _positions_hashed(key: np.ndarray, slot: np.ndarray, position: np.ndarray, n_epochs: int) -> np.ndarray:
    """``bits(bits(key[k], BATCH_ORDER, e), i)`` at every flat position (``slot`` ``k · n_epochs + e``, ``position``
    ``i``), in numpy: the segments' part in the int64 form of :func:`bits`, the positions' last hash in uint32 arrays
    updated in place (their products wrap modulo 2³², the bits the int64 form keeps with ``& MASK32``)."""
    epoch_keys = bits(key[:, None], BATCH_ORDER, np.arange(n_epochs)[None, :]).reshape(-1)
    state = mix32((epoch_keys & MASK32) ^ _GOLDEN).astype(_U32)  # bits' first hash of each segment's key
    x = state[slot]
    x ^= position.astype(_U32)
    x += _U32(_GOLDEN)
    x ^= x >> _U32(16)
    x *= _U32(0x7FEB352D)
    x ^= x >> _U32(15)
    x *= _U32(0x846CA68B)
    x ^= x >> _U32(16)
    return x
