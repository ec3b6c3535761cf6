"""QSGD (Alistarh et al. 2017, §3.1): stochastic uniform quantisation of each bucket of d values to s levels.

A bucket v becomes ``‖v‖₂ · sgn(vᵢ) · ξᵢ(v, s)``, where ξᵢ is ℓ/s or (ℓ + 1)/s with ℓ = ⌊s·|vᵢ|/‖v‖₂⌋, the upper
level with probability ``s·|vᵢ|/‖v‖₂ − ℓ``: unbiased (E Q(v) = v) with variance
``E‖Q(v) − v‖² ≤ min(d/s², √d/s)·‖v‖²`` (the paper's Lemma 3.1). With ``bits`` b per value (a sign and a level),
s = 2^(b−1) − 1 and each value is the b-bit code ``sgn·level + s`` packed into bytes; each bucket adds its norm
(float32). The rounding draws are each client's own counter-based stream (:func:`hetfed.server.compression.uniforms`);
on a CPU with Numba the rounding is one fused pass (:mod:`hetfed.server.compression.fused`), with the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from pydantic import Field

from hetfed.engine.rng import QUANTISE
from hetfed.server.compression import (
    Compressor,
    CompressorParams,
    Encoded,
    fused,
    register,
    uniforms,
)


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


def packed_size(m: int, bits: int) -> int:
    """Bytes of m codes of ``bits`` bits packed tight: ⌈m·bits/8⌉ (what :func:`pack` returns and :func:`_nbytes`
    counts)."""
    return math.ceil(m * bits / 8)


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes [S, M] in [0, 2^bits) as bytes [S, ⌈M·bits/8⌉] (uint8), one bit stream, least significant bit first:
    nothing is sent beyond the last code's byte. 8, 4 and 2 bits pack by shifts (a byte holds 1, 2 or 4 codes);
    other widths go through bit planes."""
    s, m = codes.shape
    codes = torch.nn.functional.pad(codes.to(torch.uint8), (0, (-m) % 8))  # a multiple of 8 codes fills whole bytes
    if 8 % bits == 0:
        per = 8 // bits
        parts = codes.reshape(s, -1, per)
        out = parts[:, :, 0].clone()
        for i in range(1, per):
            out |= parts[:, :, i] << (bits * i)
    else:
        shifts = torch.arange(bits, device=codes.device, dtype=torch.uint8)
        planes = (codes.unsqueeze(-1) >> shifts) & 1  # [S, M', bits]
        octets = planes.reshape(s, -1, 8)
        weights = torch.arange(8, device=codes.device, dtype=torch.uint8)
        out = (octets << weights).sum(-1, dtype=torch.int32).to(torch.uint8)
    return out[:, :packed_size(m, bits)].contiguous()  # the padding codes' bytes past the last real bit are dropped


def unpack(packed: torch.Tensor, bits: int, m: int) -> torch.Tensor:
    """The first m codes of :func:`pack`'s bytes (uint8 [S, m])."""
    s = packed.shape[0]
    packed = torch.nn.functional.pad(packed, (0, math.ceil(m / 8) * bits - packed.shape[1]))  # whole groups of 8
    if 8 % bits == 0:
        per, mask = 8 // bits, (1 << bits) - 1
        parts = torch.stack([(packed >> (bits * i)) & mask for i in range(per)], dim=-1)
        return parts.reshape(s, -1)[:, :m]
    planes = (packed.unsqueeze(-1) >> torch.arange(8, device=packed.device, dtype=torch.uint8)) & 1  # [S, B, 8]
    planes = planes.reshape(s, -1, bits)
    weights = torch.arange(bits, device=packed.device, dtype=torch.uint8)
    return (planes << weights).sum(-1, dtype=torch.int32).to(torch.uint8)[:, :m]


def _levels(v: torch.Tensor, norms: torch.Tensor, u: torch.Tensor, s_levels: int, out: torch.Tensor) -> None:
    """Buckets ``v`` [S, B, d] of norms [S, B]: ``out`` [S, B, d] gets each value's signed level ±ℓ or ±(ℓ + 1) (as
    floats). ``u`` (the draws, [S, B, d]) is overwritten; the other passes work in place on ``out`` and one
    temporary."""
    scale = torch.where(norms > 0, s_levels / norms, torch.zeros_like(norms)).unsqueeze(-1)
    r = torch.abs(v).mul_(scale)  # s·|vᵢ|/‖v‖ in [0, s]
    level = torch.floor(r, out=out)
    up = u.lt_(r.sub_(level))  # 1 with probability s|vᵢ|/‖v‖ − ℓ (u < the fraction, as the paper's test reads)
    level.add_(up).clamp_(max=s_levels).copysign_(v)  # a zero value has level 0 (its sign does not matter)


def _parts(n: int, d: int) -> list[tuple[int, int, int]]:
    """[a, b) column ranges of a flat tensor of n values, each cut in buckets of w values: the full buckets of d,
    then the short last one (when n is not a multiple of d) on its own — padding it with zeros (the encoding's
    layout) changes neither its norm nor its values, and copying the whole tensor to pad it would cost a pass."""
    full = n - n % d
    return [(a, b, w) for a, b, w in ((0, full, d), (full, n, n - full)) if b > a]


def _bucketed(delta: torch.Tensor, p: QSGDParams) -> tuple[torch.Tensor, int, list[tuple[int, int, int]]]:
    """``delta`` as rows [S, n] (float32), the bucket size d and the parts (:func:`_parts`)."""
    flat = delta.reshape(delta.shape[0], -1).to(torch.float32)
    d = _buckets(flat.shape[1], p)[0]
    return flat, d, _parts(flat.shape[1], d)


def _norms(flat: torch.Tensor, parts: list[tuple[int, int, int]]) -> torch.Tensor:
    """Each bucket's ℓ2 norm [S, buckets] of the rows of ``flat`` [S, n], part by part (:func:`_parts`)."""
    stack = flat.shape[0]
    return torch.cat([torch.linalg.vector_norm(flat[:, a:b].reshape(stack, -1, w), dim=-1) for a, b, w in parts], dim=1)


def _quantised(delta: torch.Tensor, seeds: Sequence[int], counter: int, p: QSGDParams,
               dequantise: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(the bucket norms [S, buckets], the signed levels [S, n]; or, when ``dequantise``, the decoded values
    ±level·‖v‖/s). On a CPU with Numba, one fused pass (:mod:`hetfed.server.compression.fused`: the same numbers)."""
    flat, d, parts = _bucketed(delta, p)
    stack, n = flat.shape
    norms = _norms(flat, parts)
    if fused.usable(flat):
        return norms, fused.levels(flat, norms, seeds, (QUANTISE, counter), d, levels(p), dequantise)
    u = uniforms(seeds, counter, n, delta.device)  # a client's first n draws: the same as a padded stream's
    signed = torch.empty_like(flat)
    at = 0
    for a, b, w in parts:
        cols = slice(at, at + (b - a) // w)
        _levels(flat[:, a:b].reshape(stack, -1, w), norms[:, cols], u[:, a:b].reshape(stack, -1, w), levels(p),
                signed[:, a:b].view(stack, -1, w))
        if dequantise:
            signed[:, a:b].view(stack, -1, w).mul_((norms[:, cols] / levels(p)).unsqueeze(-1))
        at = cols.stop
    return norms, signed


def _encode(delta: torch.Tensor, seeds: Sequence[int], counter: int, p: QSGDParams) -> Encoded:
    """The bucket norms (float32) and the n codes ``sgn·level + s`` packed tight: the short last bucket is not
    padded on the wire (its missing values are not sent; :func:`_decode` restores its shape)."""
    norms, signed = _quantised(delta, seeds, counter, p)
    return {"norms": norms, "codes": pack(signed.add_(levels(p)), p.bits)}


def _roundtrip(delta: torch.Tensor, seeds: Sequence[int], counter: int, p: QSGDParams) -> torch.Tensor:
    """``_decode(_encode(…))`` without the codes: ±level·‖v‖/s (the same floats: small integers are exact)."""
    return _quantised(delta, seeds, counter, p, dequantise=True)[1].reshape(delta.shape)


def _roundtrip_into(delta: torch.Tensor, seeds: Sequence[int], counter: int, p: QSGDParams, base: torch.Tensor,
                    out: torch.Tensor, left: torch.Tensor | None) -> bool:
    """``out`` ← base + :func:`_roundtrip` and ``left`` ← delta − it, in the fused kernel's one pass where it applies
    (False: it does not; the caller computes them from :func:`_roundtrip`)."""
    flat, d, parts = _bucketed(delta, p)
    if not (fused.usable(flat) and fused.takes(delta, base, out, left)):  # a float32 update: no copy made
        return False
    fused.levels(flat, _norms(flat, parts), seeds, (QUANTISE, counter), d, levels(p), True, base=base, out=out,
                 left=left)
    return True


def _decode(enc: Encoded, shape: tuple[int, ...], p: QSGDParams) -> torch.Tensor:
    s_levels = levels(p)
    n = math.prod(shape)
    d, nb = _buckets(n, p)
    norms = enc["norms"]
    stack = norms.shape[0]
    signed = unpack(enc["codes"], p.bits, n).to(torch.float32).sub_(s_levels)
    signed = torch.nn.functional.pad(signed, (0, nb * d - n))  # the short last bucket as a whole one (zeros)
    values = signed.reshape(stack, nb, d).mul_((norms / s_levels).unsqueeze(-1))
    return values.reshape(stack, -1)[:, :n].reshape(stack, *shape)


def _nbytes(shape: tuple[int, ...], p: QSGDParams) -> int:
    """What :func:`_encode` sends for one client: a float32 norm per bucket and the codes packed tight."""
    n = math.prod(shape)
    _d, nb = _buckets(n, p)
    return 4 * nb + packed_size(n, p.bits)


register(Compressor("qsgd", _encode, _decode, _nbytes, QSGDParams, roundtrip=_roundtrip, fused_into=_roundtrip_into,
                    draws=True,
                    summary="stochastic uniform quantisation to `bits` bits per value, a norm per bucket (unbiased)",
                    paper="Alistarh et al. 2017, QSGD: Communication-Efficient SGD via Gradient Quantization and "
                          "Encoding"))
