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

    def send(self, upload: Upload, reference: Params, residual: ClientState, seeds: list[int]) -> tuple[Upload,
                                                                                                          ClientState]:
        """The upload as the server decodes it, and the stack's new residuals ({} without error feedback).

        ``reference``: the broadcast's shared parameters (or one per client, ``[n, …]``: clients sent different
        versions); ``residual``: the stack's residuals (``RESIDUAL``
        names, stacked); ``seeds``: the clients' round seeds (their draws' keys)."""
        if self.compressor is None or not upload.params:  # no compression: the upload passes as it is
            return upload, residual
        names = [k for k in reference if k in upload.params]
        if not names:
            return upload, residual
        first = upload.params[names[0]]
        params = dict(upload.params)
        kept: ClientState = {}
        for counter, name in enumerate(names):
            ref = reference[name].to(first.device)
            delta = params[name].to(torch.float32) - ref
            if self.error_feedback:
                delta = delta + residual[RESIDUAL + name].to(delta.device)
            shape = tuple(params[name].shape[1:])
            sent = self.compressor.decode(self.compressor.encode(delta, seeds, counter, self.params), shape,
                                          self.params).to(delta.dtype)
            params[name] = (ref + sent).to(upload.params[name].dtype)
            if self.error_feedback:
                kept[RESIDUAL + name] = delta - sent
        return replace(upload, params=params), kept


def transport(section: dict[str, Any], where: str = "server.compression") -> Transport:
    """``server.compression`` (``{"kind": …, "error_feedback": …, **the compressor's params}``) as a Transport."""
    from hetfed.server.compression import parse

    options = dict(section)
    feedback = bool(options.pop("error_feedback", False))
    compressor, params = parse(options, where)
    if not compressor.lossy:  # the config refuses error feedback here (nothing is lost)
        return Transport()
    return Transport(compressor, params, feedback)
