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

from collections.abc import Container, Iterator, Sequence
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
    ref = ref if ref.device == theta.device else ref.to(theta.device)
    return ref if ref.dim() == theta.dim() else ref.unsqueeze(0)


#: :func:`update_norms` takes the differences about this many values at a time (a stack's clients together), and at
#: least :data:`NORM_COLUMNS` per client
NORM_SLICE, NORM_COLUMNS = 1 << 17, 4096


def update_norms(upload: Upload, reference: Params, as_stack_of: int | None = None) -> torch.Tensor:
    """``‖θ_k − θ_global‖₂`` over all shared parameters, per client (float64, on the host): :func:`_norms` read back."""
    return _norms(upload, reference, as_stack_of).cpu()


def _norms(upload: Upload, reference: Params, as_stack_of: int | None = None) -> torch.Tensor:
    """``‖θ_k − θ_global‖₂`` over all shared parameters, per client (float64, where the updates are).

    Each client's parameters are read as one row, the parameters' columns one after another, and the row is taken in
    slices of columns: on a CPU of :data:`NORM_SLICE` values a stack (at least :data:`NORM_COLUMNS` a client), so that
    neither the differences nor ``vector_norm``'s float64 copy of them is ever a whole update in memory (written
    whole, those two copies were 13.5 ms of a 28-client stack of 784×200 weights on this project's CPU, ~8 % of W1's
    round, ``benchmarks/engine.py``; 1.3–1.5 ms in slices); on an accelerator as wide as the widest parameter (its
    memory is fast, and each slice is kernel launches). A small model is then one slice: its parameters' columns
    joined, one subtraction and one norm (a parameter at a time, a 10-client stack of an MLP 64-64-64-10 was ~36 torch
    calls, 0.16 ms a round, #74). The slices' squared norms are summed in float64 and read back once. A client's norm
    depends on its stack's slicing only in float64 rounding (~1e-16). ``as_stack_of``: slice as a stack of this many
    clients would (None: this stack's own number) — a stack of several parts, each of that many clients, then gives
    each part's norms to the bit. On a CPU a slice is made float64 before its norm: the same numbers (tested), and
    torch 2.13's CPU ``vector_norm`` casting as it reads took 3.3× as long (200 × 13 107 values: 3.4 ms, against
    1.0 ms for the copy and the norm, #74); a GPU casts as it reads at no cost and keeps no copy.
    """
    n = len(upload.client_ids)
    params = upload.params
    pairs = ((params[k].reshape(n, -1), _stacked_reference(params[k], ref)) for k, ref in reference.items())
    rows = [(theta, centre.reshape(len(centre), -1)) for theta, centre in pairs if theta.shape[1]]
    if not rows:
        return torch.zeros(n, dtype=torch.float64)
    columns = sum(theta.shape[1] for theta, _ in rows)
    clients = max(n if as_stack_of is None else as_stack_of, 1)
    width = max(NORM_COLUMNS, NORM_SLICE // clients) if rows[0][0].device.type == "cpu" else \
        max(theta.shape[1] for theta, _ in rows)
    total: torch.Tensor | None = None
    for d in _column_slices(rows, width, columns):
        norm = torch.linalg.vector_norm(d.double() if d.device.type == "cpu" else d, dim=1, dtype=torch.float64)
        total = norm if columns <= width else norm.pow_(2) if total is None else total.add_(norm.pow_(2))
    assert total is not None
    return total if columns <= width else total.sqrt_()


def _column_slices(rows: list[tuple[torch.Tensor, torch.Tensor]], width: int, columns: int) -> Iterator[torch.Tensor]:
    """The differences ``θ − centre`` of ``rows`` (each parameter's ``[n, c]`` and its centre's ``[1 or n, c]``),
    their columns joined, in slices of ``width`` columns (the last narrower)."""
    for start in range(0, columns, width):
        stop, pieces, centres, offset = start + width, [], [], 0
        for theta, centre in rows:
            a, b = max(start - offset, 0), min(stop - offset, theta.shape[1])
            if a < b:
                whole = a == 0 and b == theta.shape[1]
                pieces.append(theta if whole else theta[:, a:b])
                centres.append(centre if whole else centre[:, a:b])
            offset += theta.shape[1]
        if len(pieces) == 1:
            yield pieces[0] - centres[0]
        else:
            many = max(len(c) for c in centres)
            yield torch.cat(pieces, 1) - torch.cat([c if len(c) == many else c.expand(many, -1) for c in centres], 1)


def finite_clients(upload: Upload, skip: Container[str] = ()) -> torch.Tensor:
    """Per client: True when every uploaded value (parameters and statistics) is finite (on the host); ``skip``: the
    parameters already known finite (:func:`measure`).

    A client's finite sum proves its values finite (a NaN or ±inf makes the sum non-finite),
    so only clients whose sum is not finite (a non-finite value, or finite values whose sum
    overflows) are checked value by value: one pass of reading instead of a boolean copy of
    every update. Every tensor's sums are read back at once.
    """
    flats, sums = _row_sums(upload, skip)
    return _finite_rows(flats, None if sums is None else sums.cpu(), len(upload.client_ids))


def _row_sums(upload: Upload, skip: Container[str] = ()) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """The uploaded tensors :func:`finite_clients` reads (``[n, …]`` each, as rows) and each one's row sums in
    float64 ``[tensors, n]`` where the updates are (a float's ±inf and NaN kept); None when there is none."""
    n = len(upload.client_ids)
    flats = [v.reshape(n, -1) for v in [*(v for k, v in upload.params.items() if k not in skip),
                                        *upload.extra.values()]
             if v.is_floating_point() and v.shape[:1] == (n,)]
    if not flats or not n:
        return flats, None
    device = flats[0].device
    return flats, torch.stack([flat.sum(1).to(device, torch.float64) for flat in flats])


def _finite_rows(flats: list[torch.Tensor], sums: torch.Tensor | None, n: int) -> torch.Tensor:
    """Per client: whether its rows of ``flats`` are finite, from their row sums read back (``sums``, on the host):
    a client whose sum is not finite is checked value by value."""
    ok = torch.ones(n, dtype=torch.bool)
    if sums is None:
        return ok
    suspects = ~torch.isfinite(sums)  # [tensors, n]
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


def measure(upload: Upload, reference: Params, chunk_size: int | None = None, norms: bool = True) -> Measured:
    """The finite flags and, with ``norms``, the update norms of a stack (each client against its row of
    ``reference``), sliced as a stack of ``chunk_size`` clients would be (None: its own size) — a stack that holds
    several chunks' updates gets every chunk's numbers as :meth:`Screen.admit` computes them for the chunk alone.

    The norms read every shared value: a client's float64 norm is finite only when its values and the reference's
    are (a NaN or ±inf there makes it NaN or ±inf; float32 squares summed in float64 cannot overflow), so the finite
    check reads only what they did not (the statistics, any parameter not shared) — one pass over the update, not
    two (~60 µs of a 10-client round of an MLP 64-64-64-10, #74). A norm that is not finite (a non-finite value, a
    difference that overflowed, a non-finite reference) sends the stack to the check of every value. The norms and
    the other tensors' sums are read back together: on a GPU one synchronisation a stack, not two."""
    if not norms:
        return Measured(finite_clients(upload), None)
    measured = _norms(upload, reference, chunk_size)
    flats, sums = _row_sums(upload, reference.keys())
    read = measured.cpu()[None] if sums is None else torch.cat([measured.to(sums.device)[None], sums]).cpu()
    if not bool(torch.isfinite(read[0]).all()):  # the exact check of every value (a GPU's second read-back)
        return Measured(finite_clients(upload), read[0])
    return Measured(_finite_rows(flats, None if sums is None else read[1:], len(upload.client_ids)), read[0])


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
    the mean of the two middle norms, as ``torch.quantile(·, 0.5)`` interpolates it: ``b − (b − a)·0.5``). Taken in
    Python floats (a few values: ``torch.quantile`` cost ~50 µs a round; the same float64 arithmetic, tested)."""
    values: list[float] = sorted(norms[:reference_clients].tolist())
    mid = len(values) // 2
    if len(values) % 2:
        return values[mid]
    low, high = values[mid - 1], values[mid]
    return high - (high - low) * 0.5


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

    @property
    def fresh(self) -> bool:
        """Nothing of the round held or judged yet: a whole round's upload may be judged at once (:meth:`verdicts`)."""
        return self.median is None and not self._held

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

    @staticmethod
    def verdicts(screens: Sequence[Screen], measured: Measured) -> list[torch.Tensor]:
        """:meth:`verdict` of several screens (a stacked sweep's runs), each judging an equal share of ``measured``
        (its clients', in order, as its whole round): when every update is finite, the norm filters' medians and
        thresholds in one pass for all (the float64 arithmetic of :func:`reference_median` and :func:`within`, so
        each run's verdict as alone); otherwise screen by screen."""
        runs, size = len(screens), len(measured.finite) // len(screens)
        norms = measured.norms
        same = len({(s.norm_factor, s.reference_clients, s.clip) for s in screens}) == 1
        if (not same or norms is None or screens[0].norm_factor is None or screens[0].only_finite(size)
                or not bool(measured.finite.all())):
            shares = [measured.rows(slice(i * size, (i + 1) * size)) for i in range(runs)]
            return [s.verdict(share.finite, share.norms) for s, share in zip(screens, shares, strict=True)]
        first, factor = screens[0], screens[0].norm_factor
        by_run = norms.view(runs, size)
        ordered = by_run[:, :first.reference_clients].sort(1).values
        mid = ordered.shape[1] // 2
        high = ordered[:, mid]
        medians = high if ordered.shape[1] % 2 else high - (high - ordered[:, mid - 1]) * 0.5
        passed = by_run <= (medians.clamp_min(1e-12) * factor).unsqueeze(1)
        for screen, median, rejected in zip(screens, medians.tolist(), (size - passed.sum(1)).tolist(), strict=True):
            screen.median = median
            screen.counts["rejected_norm"] += rejected
        return list(passed)

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
        if measured is None and self.clip is None and self.norm_factor is not None:
            measured = measure(upload, self.reference)  # flags and norms in one pass
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
