"""Top-k sparsification: each parameter's k = ⌈fraction·n⌉ largest-magnitude values and their positions.

Biased on its own; with ``server.compression.error_feedback`` the client keeps what it did not send and adds it
to its next update (Stich et al. 2018, Sparsified SGD with Memory; Karimireddy et al. 2019, error feedback), so
over rounds nothing is lost. Each kept value costs 8 bytes (float32 value + int32 position).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from pydantic import Field

from hetfed.server.compression import Compressor, CompressorParams, Encoded, register


class TopKParams(CompressorParams):
    fraction: float = Field(0.01, gt=0, le=1, description="share of each parameter's values sent (k = ⌈fraction·n⌉)")


def kept(n: int, p: TopKParams) -> int:
    return max(1, math.ceil(p.fraction * n))


def _encode(delta: torch.Tensor, seeds: Sequence[int], counter: int, p: TopKParams) -> Encoded:
    flat = delta.reshape(delta.shape[0], -1)
    index = flat.abs().topk(kept(flat.shape[1], p), dim=1).indices
    return {"index": index.to(torch.int32), "value": flat.gather(1, index).to(torch.float32)}


def _decode(enc: Encoded, shape: tuple[int, ...], p: TopKParams) -> torch.Tensor:
    value = enc["value"]
    out = torch.zeros(value.shape[0], math.prod(shape), dtype=value.dtype, device=value.device)
    out.scatter_(1, enc["index"].to(torch.int64), value)
    return out.reshape(value.shape[0], *shape)


register(Compressor("topk", _encode, _decode, lambda shape, p: 8 * kept(math.prod(shape), p), TopKParams,
                    summary="the k = ⌈fraction·n⌉ largest-magnitude values of each parameter and their positions",
                    paper="Stich et al. 2018, Sparsified SGD with Memory; Aji & Heafield 2017"))
