"""QSGD's stochastic rounding as one pass over a CPU update: draws, levels and (optionally) decoded values in one
loop, compiled by Numba (a dependency of hetfed).

Why a kernel: the rounding is a dozen elementwise operations over every value a round uploads (20 M on W1). As
torch operations each is a pass through memory, and on a CPU the passes — with the counter-based draw hashed in
its own passes — cost ~40 % of a W1 round. Fused, each value is read once, hashed in registers and written once:
~10× less (``benchmarks/asynchronous.py --parts compression``). Numba rather than ``torch.compile``: inductor compiled
the same loop for ~18 s per shape and process, and reduced the norms in another order than eager torch.

The kernel computes exactly what :func:`hetfed.server.compression.qsgd._levels` does in torch, bit for bit (tested):
the norms and their ratios come from torch, and every other operation is exact or rounds once in float32 in the same
order (no fast-math). So whether a run goes through it — Numba installed, a CPU tensor, a large enough update —
changes its speed, never its numbers.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from functools import cache
from typing import Any

import numpy as np
import torch

#: values in a call below which the torch path is used: the kernel's first call in a process imports Numba and
#: loads (or compiles) the kernel, ~0.5 s, which a small model's whole run would not win back (a digits MLP's stack
#: of 40 k values saves ~0.5 ms a call); from 2¹⁸ values each call saves ≥ 3 ms
FUSED_FROM = 1 << 18
#: once the kernel is loaded (by a large call), the values from which it is used: below, torch's fixed cost per
#: call is less than the kernel's
LOADED_FROM = 1 << 12
#: values a thread must have to be worth waking
VALUES_PER_THREAD = 1 << 18

_GOLDEN, _MUL1, _MUL2, _MASK = 0x9E3779B9, 0x7FEB352D, 0x846CA68B, 0xFFFFFFFF


def _mix32_py(x: Any) -> Any:
    """:func:`hetfed.streams.mix32` of one value in [0, 2³²), in uint64 arithmetic (Numba computes integers in 64
    bits), masked back to 32 bits after every product."""
    x ^= x >> np.uint64(16)
    x = (x * np.uint64(_MUL1)) & np.uint64(_MASK)
    x ^= x >> np.uint64(15)
    x = (x * np.uint64(_MUL2)) & np.uint64(_MASK)
    return x ^ (x >> np.uint64(16))


def _levels_py(v: Any, scale: Any, unscale: Any, seeds: Any, counters: Any, d: int, s: int, dequantise: bool,
               base: Any, out: Any, left: Any, first: int, last: int) -> None:
    """Buckets ``first … last−1`` (row-major over [S, buckets]) of ``v`` [S, n] into ``out`` [S, n]: each value's
    signed level ±ℓ or ±(ℓ + 1) of its bucket, times ``unscale`` (‖v‖/s) when ``dequantise`` — plus ``base`` (rows
    [1 or S, n]) when it has columns, and ``left`` [S, n] ← v − that decoded value when it has columns (error
    feedback).

    ``scale`` [S, buckets]: s/‖v‖ (0 for a zero bucket). Row j draws from the stream of its round seed ``seeds[j]``
    at ``counters`` (the purpose's, then the parameter's): :func:`hetfed.server.compression.stream_states` hashed
    here, and value i's draw is ``next32(state, i)`` — the same integer operations as :mod:`hetfed.streams`."""
    rows, n = v.shape
    buckets = scale.shape[1]
    with_base, with_left, one_base = base.shape[1] > 0, left.shape[1] > 0, base.shape[0] == 1
    mask, golden = np.uint64(_MASK), np.uint64(_GOLDEN)
    row = -1
    state = np.uint64(0)
    for job in range(first, last):
        j = job // buckets
        b = job - j * buckets
        if j != row:  # streams.keys, then bits(key, *counters), then seeded32
            row = j
            seed = seeds[j]
            h = _mix32(((seed & mask) ^ _mix32((seed >> np.uint64(32)) & mask)) ^ golden)
            for c in counters:
                h = _mix32(((h ^ (np.uint64(c) & mask)) + golden) & mask)
            state = _mix32(h ^ golden)
        lo, hi = b * d, min(b * d + d, n)
        sc, un = scale[j, b], unscale[j, b] if dequantise else np.float32(1.0)
        values, into = v[j, lo:hi], out[j, lo:hi]
        # one loop per kind of output, each without a branch per value (so LLVM can vectorise it)
        if with_base and with_left:
            plus, rest = base[0 if one_base else j, lo:hi], left[j, lo:hi]
            for i in range(hi - lo):
                q = _rounded(values[i], state, lo + i, sc, un, s)
                rest[i] = values[i] - q
                into[i] = q + plus[i]
        elif with_base:
            plus = base[0 if one_base else j, lo:hi]
            for i in range(hi - lo):
                into[i] = _rounded(values[i], state, lo + i, sc, un, s) + plus[i]
        else:
            for i in range(hi - lo):
                into[i] = _rounded(values[i], state, lo + i, sc, un, s)


def _rounded_py(value: Any, state: Any, i: int, sc: Any, un: Any, s: int) -> Any:
    """One value's signed level (times ``un``: 1, or ‖v‖/s to decode it) — :func:`hetfed.streams.next32`'s draw
    ``i`` of ``state`` as U[0, 1) (its top 24 bits), then the operations of
    :func:`hetfed.server.compression.qsgd._levels`, in float32 and in the same order."""
    drawn = _mix32(((state ^ np.uint64(i)) + np.uint64(_GOLDEN)) & np.uint64(_MASK))
    u = np.float32(drawn >> np.uint64(8)) * np.float32(1.0 / (1 << 24))
    r = abs(value) * sc
    level = np.floor(r)
    level = min(level + np.float32(u < r - level), np.float32(s))
    return np.copysign(level * un, value)


# what the kernels call: the Python functions until _kernel() binds their compiled forms
_mix32, _rounded = _mix32_py, _rounded_py


@cache
def _kernel() -> Any:
    """The compiled kernel (imported on first use: Numba takes ~0.5 s to import; compiled once, then cached on disk)."""
    from numba import njit

    global _mix32, _rounded

    def compiled(cache: bool) -> list[Any]:
        jit = njit(nogil=True, cache=cache, fastmath=False)
        return [jit(f) for f in (_mix32_py, _rounded_py, _levels_py)]

    try:
        _mix32, _rounded, levels_ = compiled(cache=True)
    except RuntimeError:  # no writable place for Numba's cache (a read-only install and home): compile each process
        _mix32, _rounded, levels_ = compiled(cache=False)
    return levels_


@cache
def available() -> bool:
    """Numba is installed (the ``numba`` extra; without it, the torch path computes the same numbers)."""
    return importlib.util.find_spec("numba") is not None


def usable(v: torch.Tensor) -> bool:
    """Whether :func:`levels` takes ``v`` [S, n]: Numba is installed, the tensor is a float32 CPU one, and large
    (:data:`FUSED_FROM`; :data:`LOADED_FROM` once the kernel is loaded). The numbers are the same either way."""
    if v.device.type != "cpu" or v.dtype != torch.float32 or not available():
        return False
    return v.numel() >= (LOADED_FROM if _kernel.cache_info().currsize else FUSED_FROM)


def levels(v: torch.Tensor, norms: torch.Tensor, seeds: Sequence[int], counters: tuple[int, ...], d: int, s: int,
           dequantise: bool, base: torch.Tensor | None = None, out: torch.Tensor | None = None,
           left: torch.Tensor | None = None) -> torch.Tensor:
    """QSGD's rounding of ``v`` [S, n] (buckets of ``d`` values, the last one shorter; ``norms`` [S, buckets]) to
    ``s`` levels: the signed levels, or the decoded values ``±level·‖v‖/s`` when ``dequantise`` — plus ``base``
    ([n] or [S, n]) where given, and ``left`` ← ``v`` − the decoded values where given; into ``out`` where given
    (all float32 and contiguous: :func:`takes`). The rows' buckets are shared out among torch's threads (the kernel
    releases the GIL)."""
    from hetfed.server.compression import pool

    kernel = _kernel()
    rows, n = v.shape
    v = v.contiguous()
    out = torch.empty_like(v) if out is None else out
    none = np.zeros((1, 0), dtype=np.float32)
    scale = torch.where(norms > 0, s / norms, torch.zeros_like(norms)).contiguous()
    unscale = (norms / s).contiguous()
    args = (v.numpy(), scale.numpy(), unscale.numpy(), np.asarray(seeds, dtype=np.uint64),
            np.asarray(counters, dtype=np.uint64), d, s, dequantise,
            none if base is None else base.reshape(-1, n).numpy(), out.view(rows, n).numpy(),
            none if left is None else left.view(rows, n).numpy())
    jobs = scale.numel()
    workers = max(1, min(torch.get_num_threads(), jobs, v.numel() // VALUES_PER_THREAD))
    cuts = [jobs * w // workers for w in range(workers + 1)]
    others = [pool(workers - 1).submit(kernel, *args, cuts[w], cuts[w + 1]) for w in range(1, workers)]
    kernel(*args, cuts[0], cuts[1])
    for f in others:
        f.result()
    return out


def takes(*tensors: torch.Tensor | None) -> bool:
    """Whether :func:`levels` can read and write these tensors in place: float32, contiguous, on the CPU."""
    return all(t is None or (t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
                             and not t.requires_grad) for t in tensors)
