"""bfloat16 transport: the update cast to bfloat16 (float32's range, 8 bits of mantissa; 2 bytes a value)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from hetfed.server.compression import Compressor, CompressorParams, Encoded, register


def _encode(delta: torch.Tensor, seeds: Sequence[int], counter: int, params: CompressorParams) -> Encoded:
    return {"value": delta.to(torch.bfloat16)}


def _decode(enc: Encoded, shape: tuple[int, ...], params: CompressorParams) -> torch.Tensor:
    return enc["value"].to(torch.float32)


register(Compressor("bf16", _encode, _decode, lambda shape, _p: 2 * math.prod(shape), CompressorParams,
                    summary="the update in bfloat16 (round to nearest; 2 bytes a value)"))
