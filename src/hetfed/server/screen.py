"""The first step of the server pipeline: screening a round's updates as they arrive.

On the *shared* parameters only (local parameters never leave a client): updates holding
NaN/inf are dropped (always; chunk by chunk, so it streams), updates whose norm
``‖θ_k − θ_global‖`` is more than ``server.screen.norm_factor`` × the *reference median* are
dropped, and under differential privacy each update is clipped to norm ``S``. The reference
median is the median norm of the round's first ``server.screen.reference_clients`` updates (in
client-id order; all of them when the round has fewer): only those are held until it is known,
so the default screen streams a round of any size with a bounded memory, and every executor
takes the same decisions whatever its chunks. For an even count the median is the mean of the
two middle norms, the same convention as the coordinate-wise median rule.

The chain makes one per round (:meth:`hetfed.server.chain.Chain.receiving`) and the executors feed it the updates
as they come; what passes goes to the rest of the chain. Pure functions over stacked tensors, so every executor (a
chunk, one client at a time, Flower replies) gets the same numbers for the same updates.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from hetfed.engine.types import Params, Upload, concat_uploads

# ------------------------------------------------------------------ per-client quantities


def deltas(upload: Upload, reference: Params) -> dict[str, torch.Tensor]:
    """Each client's update ``θ_k − θ_global`` of the shared parameters, stacked ``[n, …]``. A reference tensor
    is one model's (``[…]``, every client was sent it) or one per client (``[n, …]``, as stacked as the upload:
    an asynchronous server's clients were sent different versions)."""
    return {k: upload.params[k] - _stacked_reference(upload.params[k], ref) for k, ref in reference.items()}


def _stacked_reference(theta: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """``ref`` on ``theta``'s device with a client axis: one model's ``[1, …]``, or one per client ``[n, …]``."""
    ref = ref.to(theta.device)
    return ref if ref.dim() == theta.dim() else ref.unsqueeze(0)


#: :func:`update_norms` takes each parameter's differences about this many values at a time (a stack's clients
#: together), and at least :data:`NORM_COLUMNS` per client
NORM_SLICE, NORM_COLUMNS = 1 << 17, 4096


def update_norms(upload: Upload, reference: Params, as_stack_of: int | None = None) -> torch.Tensor:
    """``‖θ_k − θ_global‖₂`` over all shared parameters, per client (float64, on the host).

    Accumulated in float64, parameter after parameter on the device, and read back once (a read per parameter
    made the host wait for the device as often). On a CPU the differences are taken in slices of columns
    (:data:`NORM_SLICE` values, at least :data:`NORM_COLUMNS` a client), so that neither they nor
    ``vector_norm``'s float64 copy of them is ever a whole update in memory: written whole, those two copies and
    the reads back were 13.5 ms of a 28-client stack of 784×200 weights on this project's CPU (~8 % of W1's
    round, ``benchmarks/engine.py``), 1.3–1.5 ms in slices; a client alone (the sequential executor) takes few
    slices, each a few operations. A client's norm depends on its stack's slicing only in float64 rounding
    (~1e-16). On an accelerator a parameter is one slice: its memory is fast, and each slice would be kernel
    launches. ``as_stack_of``: slice as a stack of this many clients would (None: this stack's own number) — a
    stack of several parts, each of that many clients, then gives each part's norms to the bit.
    """
    n = len(upload.client_ids)
    total: torch.Tensor | None = None
    for k, ref in reference.items():
        theta = upload.params[k]
        centre = _stacked_reference(theta, ref)
        flat, centre = theta.reshape(n, -1), centre.reshape(len(centre), -1)
        clients = max(n if as_stack_of is None else as_stack_of, 1)
        width = max(NORM_COLUMNS, NORM_SLICE // clients) if flat.device.type == "cpu" else max(flat.shape[1], 1)
        for s in range(0, flat.shape[1], width):
            d = flat[:, s:s + width] - centre[:, s:s + width]
            square = torch.linalg.vector_norm(d, dim=1, dtype=torch.float64).pow(2)
            total = square if total is None else total + square.to(total.device)
    return torch.zeros(n, dtype=torch.float64) if total is None else total.sqrt().cpu()


def finite_clients(upload: Upload) -> torch.Tensor:
    """Per client: True when every uploaded value (parameters and statistics) is finite (on the host).

    A client's finite sum proves its values finite (a NaN or ±inf makes the sum non-finite),
    so only clients whose sum is not finite (a non-finite value, or finite values whose sum
    overflows) are checked value by value: one pass of reading instead of a boolean copy of
    every update. Every tensor's sums are read back at once.
    """
    n = len(upload.client_ids)
    ok = torch.ones(n, dtype=torch.bool)
    flats = [v.reshape(n, -1) for v in [*upload.params.values(), *upload.extra.values()]
             if v.is_floating_point() and v.shape[:1] == (n,)]
    if not flats or not n:
        return ok
    device = flats[0].device
    sums = torch.stack([flat.sum(1).to(device, torch.float64) for flat in flats])  # a float's ±inf and NaN kept
    suspects = ~torch.isfinite(sums).cpu()  # [tensors, n]
    if bool(suspects.any()):
        for flat, suspect in zip(flats, suspects, strict=True):
            if bool(suspect.any()):
                rows = torch.nonzero(suspect, as_tuple=True)[0]
                suspect[rows] = ~torch.isfinite(flat[rows.to(flat.device)]).all(1).cpu()
                ok &= ~suspect
    return ok


@dataclass(frozen=True)
class Measured:
    """A chunk's updates measured beforehand (:meth:`Screen.admit`): each client's finite flag (bool ``[n]``) and
    update norm (float64 ``[n]``; None when the screen has no norm filter), on the host."""

    finite: torch.Tensor
    norms: torch.Tensor | None

    def rows(self, rows: slice) -> Measured:
        return Measured(self.finite[rows], None if self.norms is None else self.norms[rows])


def measure(upload: Upload, reference: Params, chunk_size: int, norms: bool = True) -> Measured:
    """The finite flags and, with ``norms``, the update norms of a stack that holds several chunks' updates of
    ``chunk_size`` clients each (each client against its own row of ``reference``), sliced as each chunk alone would
    be: every chunk's numbers as :meth:`Screen.admit` computes them for the chunk alone."""
    return Measured(finite_clients(upload), update_norms(upload, reference, chunk_size) if norms else None)


def select(upload: Upload, keep: torch.Tensor) -> Upload:
    """The upload of the clients where ``keep`` is True."""
    if bool(keep.all()):
        return upload
    rows = torch.nonzero(keep, as_tuple=True)[0]
    ids = [upload.client_ids[i] for i in rows.tolist()]

    def take(v: torch.Tensor) -> torch.Tensor:
        return v[rows.to(v.device)]

    return Upload(ids, {k: take(v) for k, v in upload.params.items()}, take(upload.num_samples),
                  {k: take(v) for k, v in upload.extra.items()}, dict(upload.screened))


def clip_updates(upload: Upload, reference: Params, bound: float) -> Upload:
    """Scale each client's update to norm ≤ ``bound``: ``θ_g + Δ_k · min(1, S/‖Δ_k‖)`` (shared params only)."""
    norms = update_norms(upload, reference)
    factor = torch.clamp(bound / norms.clamp_min(1e-12), max=1.0)
    params = dict(upload.params)
    for k, d in deltas(upload, reference).items():
        f = factor.to(d.device, d.dtype).view(-1, *([1] * (d.dim() - 1)))
        params[k] = reference[k].to(d.device).unsqueeze(0) + d * f
    return Upload(upload.client_ids, params, upload.num_samples, upload.extra, dict(upload.screened))


# ------------------------------------------------------------------ screening


def reference_median(norms: torch.Tensor, reference_clients: int) -> float:
    """The norm filter's reference: the median norm of the first ``reference_clients`` updates (an even count:
    the mean of the two middle norms)."""
    return float(torch.quantile(norms[:reference_clients].double(), 0.5))


def within(norms: torch.Tensor, median: float, factor: float | None) -> torch.Tensor:
    """The updates whose norm is at most ``factor`` × the reference median (True: passes)."""
    assert factor is not None
    return norms <= factor * max(median, 1e-12)


@dataclass(frozen=True)
class ScreenSpec:
    """``server.screen``: the norm filter's factor (None: off) and how many first updates set its median."""

    norm_factor: float | None = 10.0
    reference_clients: int = 32


@dataclass
class Screen:
    """A round's screening of updates against the broadcast parameters ``reference``.

    Feed it each chunk with :meth:`admit` and, at the end of the round, call :meth:`flush`;
    both return the updates that passed and may be aggregated. ``counts`` keeps how many
    clients each check rejected (they reach metrics.csv).
    """

    reference: Params
    norm_factor: float | None = None
    clip: float | None = None
    #: True when the round's updates must be held together (a robust rule, FedDF, FedGen)
    keep_all: bool = False
    uniform: bool = False  # DP with uniform weighting: every update weighs 1 in running sums
    #: the median norm of this many first updates is the norm filter's reference
    reference_clients: int = 32
    counts: dict[str, int] = field(default_factory=lambda: {"rejected_nonfinite": 0, "rejected_norm": 0})
    #: the reference median once known (None: still holding the reference clients, or the filter is off)
    median: float | None = None
    _held: list[Upload] = field(default_factory=list)
    _held_norms: list[torch.Tensor] = field(default_factory=list)

    def only_finite(self, n: int) -> bool:
        """True when screening ``n`` updates at once is only the finite check (:func:`finite_clients`): no DP
        clipping, and too few updates for the norm filter's median — so a caller may check many such groups in
        one pass."""
        return self.clip is None and (self.norm_factor is None or n < 3)

    def verdict(self, finite: torch.Tensor, norms: torch.Tensor | None) -> torch.Tensor:
        """Which of a group's updates pass (bool ``[n]``), from their finite flags and update norms computed
        beforehand, the group in order; the rejections counted. What :meth:`admit` of the whole group as one chunk
        and :meth:`flush` decide, from numbers alone — an asynchronous server's buffer (`Chain.buffer_screen`),
        whose arrivals were each sent their own model version. Not under DP clipping, which changes the updates
        themselves. ``norms`` may be None when :meth:`only_finite` holds for the group."""
        if self.clip is not None:
            raise ValueError("a clipping screen changes the updates: admit them instead")
        self.counts["rejected_nonfinite"] += int((~finite).sum())
        if self.only_finite(int(finite.sum())):
            return finite.clone()
        assert norms is not None
        kept = norms[finite]
        self.median = reference_median(kept, self.reference_clients)
        passed = finite.clone()
        passed[finite] = within(kept, self.median, self.norm_factor)
        self.counts["rejected_norm"] += int(finite.sum()) - int(passed.sum())
        return passed

    def chunk(self, upload: Upload, finite: torch.Tensor | None = None) -> Upload:
        """What can be decided client by client: non-finite updates out (``finite``: the clients' flags, when
        known), DP clipping."""
        ok = finite_clients(upload) if finite is None else finite
        self.counts["rejected_nonfinite"] += int((~ok).sum())
        upload = select(upload, ok)
        if self.clip is not None and upload.client_ids:
            upload = clip_updates(upload, self.reference, self.clip)
        return upload

    def admit(self, upload: Upload, measured: Measured | None = None) -> list[Upload]:
        """A chunk's updates that may be aggregated now (none while the reference clients are still coming).
        ``measured``: their finite flags and update norms, computed beforehand with those of other runs' updates
        (:func:`measure`: a stacked sweep's runs, one pass over their joined stack)."""
        if measured is not None and self.clip is not None:
            raise ValueError("a clipping screen changes the updates: admit them unmeasured")
        upload = self.chunk(upload, None if measured is None else measured.finite)
        if not upload.client_ids:
            return []
        if self.norm_factor is None:
            return [upload]
        norms = (update_norms(upload, self.reference) if measured is None or measured.norms is None
                 else measured.norms[measured.finite])
        if self.median is not None:
            return self._judged(upload, norms)
        self._held.append(upload)
        self._held_norms.append(norms)
        if sum(len(n) for n in self._held_norms) < self.reference_clients:
            return []
        return self.flush()

    def flush(self) -> list[Upload]:
        """At the end of a round: the held updates that pass (a round of fewer than 3 is not norm-screened)."""
        if not self._held:
            return []
        held, norms = concat_uploads(self._held), torch.cat(self._held_norms)
        self._held, self._held_norms = [], []
        if self.median is None:
            if len(norms) < 3:
                return [held]
            self.median = reference_median(norms, self.reference_clients)
        return self._judged(held, norms)

    def _judged(self, upload: Upload, norms: torch.Tensor) -> list[Upload]:
        assert self.norm_factor is not None and self.median is not None
        ok = within(norms, self.median, self.norm_factor)
        self.counts["rejected_norm"] += int((~ok).sum())
        upload = select(upload, ok)
        return [upload] if upload.client_ids else []
