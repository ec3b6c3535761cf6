"""What a client's upload becomes on the wire (``server.compression``): encoded on the client, decoded for the
server, the bytes counted, and — with error feedback — what was not sent kept in the client's own state.

The executors apply :meth:`Transport.send` to every stack's upload right after the clients trained (and after a
simulated attacker altered its own): the update Δ = θ − θ_global of each shared parameter (plus the client's
residual, with error feedback) is encoded by the configured compressor (:mod:`hetfed.server.compression`) and
decoded again; the server chain then aggregates θ_global + Δ̂. The residual Δ − Δ̂ is client state under
:data:`RESIDUAL` names, never part of an upload. Without compression the upload passes untouched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import torch

from hetfed.config_server import CompressionConfig
from hetfed.engine.types import ClientState, Params, Upload
from hetfed.server.compression import Compressor, CompressorParams

#: the prefix of the client-state names that hold error feedback's residuals (``ef.fc1.weight``)
RESIDUAL = "ef."


@dataclass(frozen=True)
class Transport:
    """A method's upload encoding: a registered compressor, its parameters, and whether clients keep residuals."""

    compressor: Compressor | None = None
    params: CompressorParams | None = None
    error_feedback: bool = False

    def nbytes(self, shapes: dict[str, tuple[int, ...]]) -> int:
        """The bytes one client sends for shared parameters of these shapes (float32 when uncompressed)."""
        if self.compressor is None:
            return sum(4 * math.prod(s) for s in shapes.values())
        return sum(self.compressor.nbytes(s, self.params) for s in shapes.values())

    def initial_residuals(self, reference: Params) -> ClientState:
        """One client's zero residuals (error feedback), or nothing."""
        if not self.error_feedback:
            return {}
        return {RESIDUAL + k: torch.zeros_like(v, device="cpu") for k, v in reference.items()}

    def send(self, upload: Upload, reference: Params, residual: ClientState, seeds: list[int],
             still_read: tuple[torch.Tensor, ...] | None = None) -> tuple[Upload, ClientState]:
        """The upload as the server decodes it, and the stack's new residuals ({} without error feedback).

        ``reference``: the broadcast's shared parameters (or one per client, ``[n, …]``: clients sent different
        versions); ``residual``: the stack's residuals (``RESIDUAL``
        names, stacked); ``seeds``: the clients' round seeds (their draws' keys). ``still_read``: given, the caller
        hands the upload's tensors over and the decoded parameters overwrite them (a fresh 60 MB tensor costs as
        much in page faults as the arithmetic) — except a tensor that shares memory with ``reference``, with
        another uploaded tensor or with one of ``still_read`` (what the caller reads afterwards: the clients' new
        state), or is not contiguous; None: the upload's tensors are left as they are."""
        if self.compressor is None or not upload.params:  # no compression: the upload passes as it is
            return upload, residual
        names = [k for k in reference if k in upload.params]
        if not names:
            return upload, residual
        first = upload.params[names[0]]
        params = dict(upload.params)
        kept: ClientState = {}
        shared = {_memory(t) for t in (*reference.values(), *(still_read or ()))}
        uploaded = [_memory(t) for t in params.values()]
        shared |= {m for m in uploaded if uploaded.count(m) > 1}  # tied parameters: written once would change both
        for counter, name in enumerate(names):
            ref = reference[name].to(first.device)
            theta = params[name]
            own = (still_read is not None and theta.is_contiguous() and theta.dtype == torch.float32
                   and not theta.requires_grad and _memory(theta) not in shared)
            received = theta if own else torch.empty_like(theta)
            if self.error_feedback:
                before = residual[RESIDUAL + name]
                kept[RESIDUAL + name] = left = torch.empty(theta.shape, dtype=torch.float32, device=theta.device)
            for a, b in _blocks(theta):
                ref_b = ref if ref.dim() < theta.dim() else ref[a:b]  # one reference, or one per client
                delta = theta[a:b].to(torch.float32) - ref_b
                if self.error_feedback:
                    delta.add_(before[a:b].to(delta.device))
                self.compressor.received_into(delta, seeds[a:b], counter, self.params, ref_b, received[a:b],
                                              left[a:b] if self.error_feedback else None)
            params[name] = received
        return replace(upload, params=params), kept

    def encode(self, upload: Upload, reference: Params, residual: ClientState,
               seeds: list[int]) -> tuple[Upload, ClientState]:
        """What really travels from a stack of clients (a Flower node): each shared parameter's encoding — the
        compressor's fields, ``<name>|<field>``, one row per client (QSGD's packed codes and norms, top-k's values
        and positions) — in place of the parameter, and the stack's new residuals. :meth:`decode` on the server
        gives what :meth:`send` gives in process, bit for bit."""
        if self.compressor is None or not upload.params:
            return upload, residual
        names = [k for k in reference if k in upload.params]
        params = {k: v for k, v in upload.params.items() if k not in names}
        kept: ClientState = {}
        for counter, name in enumerate(names):
            theta = upload.params[name]
            ref = reference[name].to(theta.device)
            delta = theta.to(torch.float32) - (ref if ref.dim() == theta.dim() else ref.unsqueeze(0))
            if self.error_feedback:
                delta = delta + residual[RESIDUAL + name].to(delta.device)
            encoded = self.compressor.encode(delta, seeds, counter, self.params)
            if self.error_feedback:
                sent = self.compressor.decode(encoded, tuple(theta.shape[1:]), self.params).to(delta.dtype)
                kept[RESIDUAL + name] = delta - sent
            params.update({_encoded_name(name, f): v for f, v in encoded.items()})
        return replace(upload, params=params), kept

    def decode(self, upload: Upload, reference: Params) -> Upload:
        """The server's reading of an encoded upload (:meth:`encode`): θ_global + Δ̂ for each parameter."""
        if self.compressor is None:
            return upload
        params = {k: v for k, v in upload.params.items() if FIELD not in k}
        for name, ref in reference.items():
            fields = {k.split(FIELD, 1)[1]: v for k, v in upload.params.items() if k.startswith(name + FIELD)}
            if not fields:
                continue
            delta = self.compressor.decode(fields, tuple(ref.shape), self.params)
            params[name] = (delta.to(ref.device) + ref.unsqueeze(0)).to(ref.dtype)
        return replace(upload, params=params)


#: separates a parameter's name from its encoding's fields in a wire upload (``fc1.weight|codes``)
FIELD = "|"


def _encoded_name(name: str, field: str) -> str:
    return f"{name}{FIELD}{field}"


#: values per block of clients a parameter is compressed in: a block's temporaries stay in cache and reuse the
#: allocator's memory, where a W1 layer's stack at once (60 MB) is a fresh mapping whose page faults cost as much as
#: the arithmetic (blocks change no number: each client's encoding and draws are its own)
BLOCK_VALUES = 1 << 20


def _memory(t: torch.Tensor) -> int:
    """Where a tensor's storage starts (views of one tensor share it)."""
    return t.untyped_storage().data_ptr()


def _blocks(stacked: torch.Tensor) -> list[tuple[int, int]]:
    """[a, b) ranges of clients of a stacked tensor, each ~:data:`BLOCK_VALUES` values on a CPU; one block
    elsewhere: a GPU has no cache for a block to stay in, and each block launches the compressor's few dozen
    kernels again (QSGD on W1 took 3.7× a round on an H100 in ~25 blocks, results/gpu_h100_2026-11-27b)."""
    n = stacked.shape[0]
    if stacked.device.type != "cpu":
        return [(0, n)]
    per = max(1, BLOCK_VALUES // max(1, stacked[0].numel()))
    return [(a, min(n, a + per)) for a in range(0, n, per)]


def transport(section: CompressionConfig | dict[str, Any]) -> Transport:
    """``server.compression`` (or a plain ``{"kind": …, "error_feedback": …, **the compressor's params}``) as a
    Transport."""
    from hetfed.server.compression import parse

    chosen = section if isinstance(section, CompressionConfig) else CompressionConfig.model_validate(section)
    compressor, params = parse(chosen)
    if not compressor.lossy:  # the config refuses error feedback here (nothing is lost)
        return Transport()
    return Transport(compressor, params, chosen.error_feedback)
