"""Compressors: what a client's update becomes on the wire (``server.compression``), and back.

Each compressor is one file in this package that calls :func:`register` with a :class:`Compressor`: its name
(``server.compression.kind``), its own parameters (a pydantic model, validated where the config is,
``server.compression.<key>``), ``encode`` — a stack of clients' updates Δ = θ_client − θ_global, one tensor per
shared parameter, into the bytes a client sends — and ``decode``, back to the stacked Δ the server aggregates.
A compressor that loses information may keep what it did not send in the client's own state (``error_feedback``:
the residual is added to the next round's update, never sent). Compressors are found by importing this
package's modules; nothing lists them.

Every draw a compressor makes (QSGD's stochastic rounding) comes from the clients' own counter-based streams
(:mod:`hetfed.streams`), so it does not depend on how clients are stacked or on the executor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

from hetfed.registry import Registry


class CompressorParams(BaseModel):
    """A compressor's own parameters (none by default); unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


#: one parameter's encoding for a stack of clients: named tensors, each with the stack on its leading axis
Encoded = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Compressor:
    """One registered compressor.

    ``encode(delta [S, …], keys [S], counter, params)`` → the parameter's encoding (``keys``: the clients' stream
    keys, ``counter``: the parameter's position, so each parameter draws its own numbers); ``decode(encoded,
    shape, params)`` → Δ̂ [S, …] as the server reads it; ``nbytes(shape, params)`` → the bytes one client sends
    for a parameter of that shape (what metrics.csv counts). ``lossy``: Δ̂ may differ from Δ, so error feedback
    means something.
    """

    name: str
    encode: Callable[[torch.Tensor, torch.Tensor, int, Any], Encoded]
    decode: Callable[[Encoded, tuple[int, ...], Any], torch.Tensor]
    nbytes: Callable[[tuple[int, ...], Any], int]
    Params: type[CompressorParams]
    summary: str
    paper: str = ""
    lossy: bool = True


def _described(c: Compressor) -> dict[str, Any]:
    from hetfed.registry import describe_params

    return {"summary": c.summary, "paper": c.paper, "lossy": c.lossy, "params": describe_params(c.Params)}


COMPRESSORS: Registry[Compressor] = Registry("compressor", __name__, "server.compression.kind", describe=_described,
                                             noun="compressor")


def register(c: Compressor) -> Compressor:
    return COMPRESSORS.register(c.name, c)


def parse(section: dict[str, Any], where: str = "server.compression") -> tuple[Compressor, CompressorParams]:
    """``{"kind": name, **its params}`` → the compressor and its validated parameters (one-line errors naming the
    key)."""
    options = dict(section)
    name = str(options.pop("kind", "none"))
    params = COMPRESSORS.params(name, options, where)
    assert isinstance(params, CompressorParams)
    return COMPRESSORS.get(name), params


def element_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()
