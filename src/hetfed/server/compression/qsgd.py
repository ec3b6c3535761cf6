"""QSGD (Alistarh et al. 2017, §3.1): stochastic uniform quantisation of each bucket of d values to s levels.

A bucket v becomes ``‖v‖₂ · sgn(vᵢ) · ξᵢ(v, s)``, where ξᵢ is ℓ/s or (ℓ + 1)/s with ℓ = ⌊s·|vᵢ|/‖v‖₂⌋, the upper
level with probability ``s·|vᵢ|/‖v‖₂ − ℓ``: unbiased (E Q(v) = v) with variance
``E‖Q(v) − v‖² ≤ min(d/s², √d/s)·‖v‖²`` (the paper's Lemma 3.1). With ``bits`` b per value (a sign and a level),
s = 2^(b−1) − 1 and each value is the b-bit code ``sgn·level + s`` packed into bytes; each bucket adds its norm
(float32). The rounding draws come from the clients' counter-based streams (:mod:`hetfed.streams`).
"""

from __future__ import annotations

import math

import torch
from pydantic import Field

from hetfed import streams
from hetfed.server.compression import Compressor, CompressorParams, Encoded, register


class QSGDParams(CompressorParams):
    bits: int = Field(8, ge=2, le=8, description="bits per value, its sign included (s = 2^(bits−1) − 1 levels)")
    bucket: int | None = Field(512, ge=1, description="values per bucket, each with its own norm (None: one "
                               "bucket per tensor; the paper's experiments use 512)")


def levels(p: QSGDParams) -> int:
    """s, the number of non-zero levels."""
    return (1 << (p.bits - 1)) - 1


def _buckets(n: int, p: QSGDParams) -> tuple[int, int]:
    """(values per bucket, buckets) for a tensor of n values."""
    d = n if p.bucket is None else min(p.bucket, n)
    return d, math.ceil(n / d)


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes [S, M] in [0, 2^bits) as bytes [S, ⌈M/8⌉·bits] (uint8), least significant bit first (the last byte
    padded: a tight encoder sends ⌈M·bits/8⌉, what :func:`_nbytes` counts)."""
    s, m = codes.shape
    codes = torch.nn.functional.pad(codes, (0, (-m) % 8))  # a multiple of 8 codes fills whole bytes
    shifts = torch.arange(bits, device=codes.device)
    planes = (codes.unsqueeze(-1) >> shifts) & 1  # [S, M', bits]
    octets = planes.reshape(s, -1, 8)
    return (octets << torch.arange(8, device=codes.device)).sum(-1).to(torch.uint8)


def unpack(packed: torch.Tensor, bits: int, m: int) -> torch.Tensor:
    """The first m codes of :func:`pack`'s bytes (int64 [S, m])."""
    s = packed.shape[0]
    planes = (packed.to(torch.int64).unsqueeze(-1) >> torch.arange(8, device=packed.device)) & 1  # [S, B, 8]
    planes = planes.reshape(s, -1, bits)
    codes = (planes << torch.arange(bits, device=packed.device)).sum(-1)
    return codes[:, :m]


def _encode(delta: torch.Tensor, keys: torch.Tensor, counter: int, p: QSGDParams) -> Encoded:
    s_levels = levels(p)
    stack = delta.shape[0]
    flat = delta.reshape(stack, -1).to(torch.float32)
    n = flat.shape[1]
    d, nb = _buckets(n, p)
    v = torch.nn.functional.pad(flat, (0, nb * d - n)).reshape(stack, nb, d)
    norms = torch.linalg.vector_norm(v, dim=-1)  # [S, nb]
    safe = torch.where(norms > 0, norms, torch.ones_like(norms))
    r = v.abs() / safe.unsqueeze(-1) * s_levels
    low = torch.floor(r)
    positions = torch.arange(nb * d, device=delta.device).reshape(1, nb, d)
    u = streams.uniform(keys.reshape(stack, 1, 1), streams.QUANTISE, counter, positions)
    level = (low + (u < r - low).to(low.dtype)).clamp(max=s_levels).to(torch.int64)
    signed = torch.where(v < 0, -level, level)
    return {"norms": norms, "codes": pack((signed + s_levels).reshape(stack, -1), p.bits)}


def _decode(enc: Encoded, shape: tuple[int, ...], p: QSGDParams) -> torch.Tensor:
    s_levels = levels(p)
    n = math.prod(shape)
    d, nb = _buckets(n, p)
    norms = enc["norms"]
    stack = norms.shape[0]
    signed = unpack(enc["codes"], p.bits, nb * d) - s_levels
    values = signed.reshape(stack, nb, d).to(torch.float32) * (norms.unsqueeze(-1) / s_levels)
    return values.reshape(stack, -1)[:, :n].reshape(stack, *shape)


def _nbytes(shape: tuple[int, ...], p: QSGDParams) -> int:
    n = math.prod(shape)
    _d, nb = _buckets(n, p)
    return 4 * nb + math.ceil(n * p.bits / 8)


register(Compressor("qsgd", _encode, _decode, _nbytes, QSGDParams,
                    summary="stochastic uniform quantisation to `bits` bits per value, a norm per bucket (unbiased)",
                    paper="Alistarh et al. 2017, QSGD: Communication-Efficient SGD via Gradient Quantization and "
                          "Encoding"))
