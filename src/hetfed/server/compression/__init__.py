"""Compressors: what a client's update becomes on the wire (``server.compression``), and back.

Each compressor is one file in this package that calls :func:`register` with a :class:`Compressor`: its name
(``server.compression.kind``), its own parameters (a pydantic model, validated where the config is,
``server.compression.<key>``), ``encode`` — a stack of clients' updates Δ = θ_client − θ_global, one tensor per
shared parameter, into the bytes a client sends — and ``decode``, back to the stacked Δ the server aggregates.
A compressor that loses information may keep what it did not send in the client's own state (``error_feedback``:
the residual is added to the next round's update, never sent). Compressors are found by importing this
package's modules; nothing lists them.

Every draw a compressor makes (QSGD's stochastic rounding) comes from the client's own stream, keyed by its round
seed and the parameter (:func:`uniforms`), so it does not depend on how clients are stacked or on the executor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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

    ``encode(delta [S, …], seeds, counter, params)`` → the parameter's encoding (``seeds``: the clients' round
    seeds, ``counter``: the parameter's position, so each parameter draws its own numbers: :func:`uniforms`); ``decode(encoded,
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

    def received(self, delta: torch.Tensor, seeds: Sequence[int], counter: int, params: Any) -> torch.Tensor:
        """Δ̂ [S, …], what the server decodes from the stack's encoded ``delta``."""
        if self.roundtrip is not None:
            return self.roundtrip(delta, seeds, counter, params)
        return self.decode(self.encode(delta, seeds, counter, params), tuple(delta.shape[1:]), params)


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


def parse(section: dict[str, Any], where: str = "server.compression") -> tuple[Compressor, CompressorParams]:
    """``{"kind": name, **its params}`` → the compressor and its validated parameters (one-line errors naming the
    key)."""
    options = dict(section)
    name = str(options.pop("kind", "none"))
    params = COMPRESSORS.params(name, options, where)
    assert isinstance(params, CompressorParams)
    return COMPRESSORS.get(name), params


#: draws a thread must have to be worth waking: right after torch work its own threads still hold the cores a
#: while (a 6-client block drew 1.7× slower on two threads than on one there)
DRAWS_PER_THREAD = 1 << 22

_POOL: tuple[int, int, Any] | None = None  # (process id, workers, ThreadPoolExecutor): kept, threads cost ~0.1 ms


def _pool(workers: int) -> Any:
    """A thread pool of at least ``workers`` threads for this process (a forked child makes its own)."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    global _POOL
    if _POOL is None or _POOL[0] != os.getpid() or _POOL[1] < workers:
        _POOL = (os.getpid(), workers, ThreadPoolExecutor(max(1, workers), thread_name_prefix="hetfed-draws"))
    return _POOL[2]


def uniforms(seeds: Sequence[int], counter: int, n: int, device: torch.device | str) -> torch.Tensor:
    """U[0, 1) float32 [S, n]: row j from client j's own generator (NumPy's PCG64), keyed by (its round seed,
    QUANTISE, counter).

    Per-client host generators rather than :mod:`hetfed.streams`' counter hash: a compressor draws once per value of
    every upload (20 M values a round on W1), where the hash costs ~11× a PCG64 stream on this project's CPU; the
    draws are made on the CPU whatever the device (the same numbers everywhere) and moved once per parameter and
    round. NumPy releases the GIL while it fills an array, so the clients' rows are drawn on as many threads as
    torch computes with (each row is its client's whatever the thread)."""
    import numpy as np

    from hetfed.engine.rng import QUANTISE, derive_seed

    out = np.empty((len(seeds), n), dtype=np.float32)
    keys = [derive_seed(seed, QUANTISE, counter) for seed in seeds]

    def fill(rows: range) -> None:
        for j in rows:
            np.random.Generator(np.random.PCG64(keys[j])).random(dtype=np.float32, out=out[j])

    workers = max(1, min(torch.get_num_threads(), len(keys), len(keys) * n // DRAWS_PER_THREAD))
    shares = [range(w, len(keys), workers) for w in range(workers)]
    others = [_pool(workers - 1).submit(fill, rows) for rows in shares[1:]]
    fill(shares[0])
    for f in others:
        f.result()
    return torch.from_numpy(out).to(device)
