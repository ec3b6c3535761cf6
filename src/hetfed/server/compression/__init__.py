"""Compressors: what a client's update becomes on the wire (``server.compression``), and back.

Each compressor is one file in this package that calls :func:`register` with a :class:`Compressor`: its name
(``server.compression.kind``), its own parameters (a pydantic model, validated where the config is,
``server.compression.<key>``), ``encode`` — a stack of clients' updates Δ = θ_client − θ_global, one tensor per
shared parameter, into the bytes a client sends — and ``decode``, back to the stacked Δ the server aggregates.
A compressor that loses information may keep what it did not send in the client's own state (``error_feedback``:
the residual is added to the next round's update, never sent). Compressors are found by importing this
package's modules; nothing lists them.

Every draw a compressor makes (QSGD's stochastic rounding) comes from the client's own counter-based stream, keyed
by its round seed and the parameter (:func:`uniforms`), so it does not depend on how clients are stacked, on the
executor or on the device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

from hetfed.config_server import CompressionConfig
from hetfed.registry import Registry


class CompressorParams(BaseModel):
    """A compressor's own parameters (none by default); unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


#: one parameter's encoding for a stack of clients: named tensors, each with the stack on its leading axis
Encoded = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Compressor:
    """One registered compressor.

    ``encode(delta [S, …], seeds, counter, params)`` → the parameter's encoding (``seeds``: the clients' round
    seeds, ``counter``: the parameter's position, so each parameter draws its own numbers: :func:`uniforms`);
    ``decode(encoded,
    shape, params)`` → Δ̂ [S, …] as the server reads it; ``nbytes(shape, params)`` → the bytes one client sends
    for a parameter of that shape (what metrics.csv counts). ``lossy``: Δ̂ may differ from Δ, so error feedback
    means something. ``roundtrip(delta, seeds, counter, params)``, where given, is ``decode(encode(…))`` bit for bit
    without building the wire format — what an in-process executor, where nothing travels, calls
    (:meth:`received`).
    """

    name: str
    encode: Callable[[torch.Tensor, Sequence[int], int, Any], Encoded]
    decode: Callable[[Encoded, tuple[int, ...], Any], torch.Tensor]
    nbytes: Callable[[tuple[int, ...], Any], int]
    Params: type[CompressorParams]
    summary: str
    paper: str = ""
    lossy: bool = True
    roundtrip: Callable[[torch.Tensor, Sequence[int], int, Any], torch.Tensor] | None = None
    #: the encoding draws random numbers (each client's own stream): a change of generator changes its numbers
    draws: bool = False
    #: :meth:`received_into` in one pass where it can (returns False where it cannot: the generic path runs)
    fused_into: Callable[..., bool] | None = None

    def received(self, delta: torch.Tensor, seeds: Sequence[int], counter: int, params: Any) -> torch.Tensor:
        """Δ̂ [S, …], what the server decodes from the stack's encoded ``delta``."""
        if self.roundtrip is not None:
            return self.roundtrip(delta, seeds, counter, params)
        return self.decode(self.encode(delta, seeds, counter, params), tuple(delta.shape[1:]), params)

    def received_into(self, delta: torch.Tensor, seeds: Sequence[int], counter: int, params: Any,
                      base: torch.Tensor, out: torch.Tensor, left: torch.Tensor | None = None) -> None:
        """``out`` ← ``base`` + Δ̂ (the parameters the server reads; ``base`` the reference, one for every client or
        one per client) and, given, ``left`` ← ``delta`` − Δ̂ (error feedback's residual): what the in-process
        transport computes, without a tensor for Δ̂ where the compressor fuses it (:attr:`fused_into`)."""
        if self.fused_into is not None and self.fused_into(delta, seeds, counter, params, base, out, left):
            return
        sent = self.received(delta, seeds, counter, params).to(delta.dtype)
        if left is not None:
            torch.sub(delta, sent, out=left)
        torch.add(sent, base, out=out)


def _described(c: Compressor) -> dict[str, Any]:
    from hetfed.registry import describe_params

    return {"summary": c.summary, "paper": c.paper, "lossy": c.lossy, "params": describe_params(c.Params)}


COMPRESSORS: Registry[Compressor] = Registry("compressor", __name__, "server.compression.kind", describe=_described,
                                             noun="compressor")


def register(c: Compressor) -> Compressor:
    return COMPRESSORS.register(c.name, c)


def casting(name: str, dtype: torch.dtype, summary: str) -> Compressor:
    """A compressor that sends the update cast to a narrower float ``dtype`` (rounded to nearest) and back."""
    import math

    def encode(delta: torch.Tensor, seeds: Sequence[int], counter: int, params: CompressorParams) -> Encoded:
        return {"value": delta.to(dtype)}

    def decode(enc: Encoded, shape: tuple[int, ...], params: CompressorParams) -> torch.Tensor:
        return enc["value"].to(torch.float32)

    size = torch.empty((), dtype=dtype).element_size()
    return Compressor(name, encode, decode, lambda shape, _p: size * math.prod(shape), CompressorParams, summary)


def parse(section: CompressionConfig | dict[str, Any]) -> tuple[Compressor, CompressorParams]:
    """``server.compression`` (or a plain ``{"kind": name, **its params}``) → the compressor and its validated
    parameters."""
    chosen = section if isinstance(section, CompressionConfig) else CompressionConfig.model_validate(section)
    return COMPRESSORS.get(chosen.kind), chosen.params


_POOL: tuple[int, int, Any] | None = None  # (process id, workers, ThreadPoolExecutor): kept, threads cost ~0.1 ms


def pool(workers: int) -> Any:
    """A thread pool of at least ``workers`` threads for this process (a forked child makes its own): what a
    compressor's kernels that release the GIL (:mod:`hetfed.server.compression.fused`) run on."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    global _POOL
    if _POOL is None or _POOL[0] != os.getpid() or _POOL[1] < workers:
        _POOL = (os.getpid(), workers, ThreadPoolExecutor(max(1, workers), thread_name_prefix="hetfed-compress"))
    return _POOL[2]


def stream_states(seeds: Sequence[int], counter: int, device: torch.device | str) -> torch.Tensor:
    """Each client's rounding stream for the parameter at position ``counter``: the states ``[S]`` (int32,
    :func:`hetfed.streams.seeded32`) of ``bits(key, QUANTISE, counter)``, ``key`` the client's round seed folded
    (:func:`hetfed.streams.keys`); its draw ``i`` is ``next32(state, i)``. Hashed for the whole stack at once."""
    from hetfed import streams
    from hetfed.engine.rng import QUANTISE

    return streams.seeded32(streams.bits(streams.keys(seeds, device), QUANTISE, counter))


def uniforms(seeds: Sequence[int], counter: int, n: int, device: torch.device | str) -> torch.Tensor:
    """U[0, 1) float32 [S, n]: value i of row j is the top 24 bits of draw i of client j's stream
    (:func:`stream_states`), times 2⁻²⁴ — exact, and the same on every device.

    Counter-based like every other client draw (:mod:`hetfed.streams`), computed where the update is: a client's
    numbers do not depend on its stack, and nothing is drawn on the host. (Runs of ``random_streams``
    ``counter-lowbias32-v1`` drew them from a PCG64 generator per client on the host.) On a CPU, QSGD hashes them
    inside its fused kernel instead (:mod:`hetfed.server.compression.fused`): the same bits."""
    from hetfed import streams

    states = stream_states(seeds, counter, device)
    drawn = streams.next32(states[:, None], torch.arange(n, dtype=torch.int32, device=states.device)[None])
    return ((drawn >> 8) & 0xFFFFFF).to(torch.float32).mul_(1.0 / (1 << 24))
