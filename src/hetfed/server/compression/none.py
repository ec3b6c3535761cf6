"""No compression: the update travels as it is (float32)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from hetfed.server.compression import Compressor, CompressorParams, Encoded, register


def _encode(delta: torch.Tensor, seeds: Sequence[int], counter: int, params: CompressorParams) -> Encoded:
    return {"value": delta}


def _decode(enc: Encoded, shape: tuple[int, ...], params: CompressorParams) -> torch.Tensor:
    return enc["value"]


register(Compressor("none", _encode, _decode, lambda shape, _p: 4 * math.prod(shape), CompressorParams,
                    summary="the update as it is (float32)", lossy=False))
