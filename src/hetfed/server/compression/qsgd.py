"""QSGD (Alistarh et al. 2017, §3.1): stochastic uniform quantisation of each bucket of d values to s levels.

A bucket v becomes ``‖v‖₂ · sgn(vᵢ) · ξᵢ(v, s)``, where ξᵢ is ℓ/s or (ℓ + 1)/s with ℓ = ⌊s·|vᵢ|/‖v‖₂⌋, the upper
level with probability ``s·|vᵢ|/‖v‖₂ − ℓ``: unbiased (E Q(v) = v) with variance
``E‖Q(v) − v‖² ≤ min(d/s², √d/s)·‖v‖²`` (the paper's Lemma 3.1). With ``bits`` b per value (a sign and a level),
s = 2^(b−1) − 1 and each value is the b-bit code ``sgn·level + s`` packed into bytes; each bucket adds its norm
(float32). The rounding draws are each client's own (:func:`hetfed.server.compression.uniforms`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from pydantic import Field

from hetfed.server.compression import Compressor, CompressorParams, Encoded, register, uniforms


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
    padded: a tight encoder sends ⌈M·bits/8⌉, what :func:`_nbytes` counts). 8, 4 and 2 bits pack by shifts (a byte
    holds 1, 2 or 4 codes); other widths go through bit planes."""
    s, m = codes.shape
    codes = torch.nn.functional.pad(codes.to(torch.uint8), (0, (-m) % 8))  # a multiple of 8 codes fills whole bytes
    if 8 % bits == 0:
        per = 8 // bits
        parts = codes.reshape(s, -1, per)
        out = parts[:, :, 0].clone()
        for i in range(1, per):
            out |= parts[:, :, i] << (bits * i)
        return out
    shifts = torch.arange(bits, device=codes.device, dtype=torch.uint8)
    planes = (codes.unsqueeze(-1) >> shifts) & 1  # [S, M', bits]
    octets = planes.reshape(s, -1, 8)
    weights = torch.arange(8, device=codes.device, dtype=torch.uint8)
    return (octets << weights).sum(-1, dtype=torch.int32).to(torch.uint8)


def unpack(packed: torch.Tensor, bits: int, m: int) -> torch.Tensor:
    """The first m codes of :func:`pack`'s bytes (uint8 [S, m])."""
    s = packed.shape[0]
    if 8 % bits == 0:
        per, mask = 8 // bits, (1 << bits) - 1
        parts = torch.stack([(packed >> (bits * i)) & mask for i in range(per)], dim=-1)
        return parts.reshape(s, -1)[:, :m]
    planes = (packed.unsqueeze(-1) >> torch.arange(8, device=packed.device, dtype=torch.uint8)) & 1  # [S, B, 8]
    planes = planes.reshape(s, -1, bits)
    weights = torch.arange(bits, device=packed.device, dtype=torch.uint8)
    return (planes << weights).sum(-1, dtype=torch.int32).to(torch.uint8)[:, :m]


def _encode(delta: torch.Tensor, seeds: Sequence[int], counter: int, p: QSGDParams) -> Encoded:
    s_levels = levels(p)
    stack = delta.shape[0]
    flat = delta.reshape(stack, -1).to(torch.float32)
    n = flat.shape[1]
    d, nb = _buckets(n, p)
    v = torch.nn.functional.pad(flat, (0, nb * d - n)).reshape(stack, nb, d)
    norms = torch.linalg.vector_norm(v, dim=-1)  # [S, nb]
    scale = torch.where(norms > 0, s_levels / norms, torch.zeros_like(norms)).unsqueeze(-1)
    r = v.abs().mul_(scale)  # s·|vᵢ|/‖v‖ in [0, s]
    low = torch.floor(r)
    u = uniforms(seeds, counter, nb * d, delta.device).reshape(stack, nb, d)
    level = low.add_(u < r.sub_(low)).clamp_(max=s_levels)  # ℓ, or ℓ + 1 with probability s|vᵢ|/‖v‖ − ℓ
    code = level.mul_(torch.sign(v)).add_(s_levels)  # sgn·level + s, in [0, 2s] (a zero value has level 0)
    return {"norms": norms, "codes": pack(code.reshape(stack, -1), p.bits)}


def _decode(enc: Encoded, shape: tuple[int, ...], p: QSGDParams) -> torch.Tensor:
    s_levels = levels(p)
    n = math.prod(shape)
    d, nb = _buckets(n, p)
    norms = enc["norms"]
    stack = norms.shape[0]
    signed = unpack(enc["codes"], p.bits, nb * d).to(torch.float32).sub_(s_levels)
    values = signed.reshape(stack, nb, d).mul_((norms / s_levels).unsqueeze(-1))
    return values.reshape(stack, -1)[:, :n].reshape(stack, *shape)


def _nbytes(shape: tuple[int, ...], p: QSGDParams) -> int:
    n = math.prod(shape)
    _d, nb = _buckets(n, p)
    return 4 * nb + math.ceil(n * p.bits / 8)


register(Compressor("qsgd", _encode, _decode, _nbytes, QSGDParams,
                    summary="stochastic uniform quantisation to `bits` bits per value, a norm per bucket (unbiased)",
                    paper="Alistarh et al. 2017, QSGD: Communication-Efficient SGD via Gradient Quantization and "
                          "Encoding"))
