"""What the server does with a round's updates before and while combining them.

Two jobs, both on the *shared* parameters only (local parameters never leave a client):

- **screening** (:class:`Screen`): updates holding NaN/inf are dropped (always; chunk
  by chunk, so it streams), updates whose norm ``‖θ_k − θ_global‖`` is more than
  ``train.reject_norm_factor`` × the *reference median* are dropped, and under
  differential privacy each update is clipped to norm ``S``. The reference median is
  the median norm of the round's first ``train.norm_reference_clients`` updates (in
  client-id order; all of them when the round has fewer): only those are held until
  it is known, so the default screen streams a round of any size with a bounded
  memory, and every executor takes the same decisions whatever its chunks. For an
  even count the median is the mean of the two middle norms, the same convention as
  the coordinate-wise median rule;
- **combining** (:func:`combine`): FedAvg's sample-weighted mean, a robust rule
  (coordinate-wise median, trimmed mean, Krum, Multi-Krum — unweighted, as in their
  papers; Flower's Multi-Krum instead averages the kept updates weighted by their
  sample counts, which ``train.multi_krum_weighted`` selects), or DP-FedAvg's clipped
  mean plus Gaussian noise.

Pure functions over stacked tensors, so every executor (a chunk, one client at a
time, Flower replies) gets the same numbers for the same updates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from hetfed.engine.types import Params, StreamedUpload, Upload, concat_uploads

AGGREGATORS = ("mean", "median", "trimmed_mean", "krum", "multi_krum")


# ------------------------------------------------------------------ per-client quantities


def deltas(upload: Upload, reference: Params) -> dict[str, torch.Tensor]:
    """Each client's update ``θ_k − θ_global`` of the shared parameters, stacked ``[n, …]``."""
    return {k: upload.params[k] - ref.to(upload.params[k].device).unsqueeze(0) for k, ref in reference.items()}


def update_norms(upload: Upload, reference: Params) -> torch.Tensor:
    """``‖θ_k − θ_global‖₂`` over all shared parameters, per client (float64).

    Accumulated in float64 by ``vector_norm`` without a float64 copy of every update (that
    copy and its square were ~7 % of a compute-bound round: ``benchmarks/engine.py``, docs/scale.md).
    """
    n = len(upload.client_ids)
    total = torch.zeros(n, dtype=torch.float64)
    for d in deltas(upload, reference).values():
        total += torch.linalg.vector_norm(d.reshape(n, -1), dim=1, dtype=torch.float64).cpu().pow(2)
    return total.sqrt()


def finite_clients(upload: Upload) -> torch.Tensor:
    """Per client: True when every uploaded value (parameters and statistics) is finite.

    A client's finite sum proves its values finite (a NaN or ±inf makes the sum non-finite),
    so only clients whose sum is not finite (a non-finite value, or finite values whose sum
    overflows) are checked value by value: one pass of reading instead of a boolean copy of
    every update.
    """
    n = len(upload.client_ids)
    ok = torch.ones(n, dtype=torch.bool)
    for v in [*upload.params.values(), *upload.extra.values()]:
        if v.is_floating_point() and v.shape[:1] == (n,):
            flat = v.reshape(n, -1)
            suspect = ~torch.isfinite(flat.sum(1)).cpu()
            if bool(suspect.any()):
                rows = torch.nonzero(suspect, as_tuple=True)[0]
                suspect[rows] = ~torch.isfinite(flat[rows.to(flat.device)]).all(1).cpu()
                ok &= ~suspect
    return ok


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


def norm_factor(algo) -> float | None:
    """The norm filter's factor for ``algo`` (None: off; under DP clipping bounds every update already)."""
    return None if algo.dp else algo.train.reject_norm_factor


def holds_round(algo) -> bool:
    """True when a round's updates must be held together instead of streamed: a robust rule, or an
    algorithm that needs every client's update (FedDF, FedGen). The norm filter holds only its reference
    clients (:class:`Screen`)."""
    return algo.train.aggregator != "mean" or algo.needs_all_updates


def held_for_screen(algo, per_round: int) -> int:
    """How many updates of a round the norm filter holds at most (its reference clients; 0 when off)."""
    return 0 if norm_factor(algo) is None else min(per_round, algo.train.norm_reference_clients)


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

    @classmethod
    def for_round(cls, algo, reference: Params) -> Screen:
        dp = algo.dp
        return cls(reference, norm_factor(algo), algo.privacy.clip if dp else None, keep_all=holds_round(algo),
                   uniform=dp and algo.privacy.weighting == "uniform",
                   reference_clients=algo.train.norm_reference_clients)

    def chunk(self, upload: Upload) -> Upload:
        """What can be decided client by client: non-finite updates out, DP clipping."""
        ok = finite_clients(upload)
        self.counts["rejected_nonfinite"] += int((~ok).sum())
        upload = select(upload, ok)
        if self.clip is not None and upload.client_ids:
            upload = clip_updates(upload, self.reference, self.clip)
        return upload

    def admit(self, upload: Upload) -> list[Upload]:
        """A chunk's updates that may be aggregated now (none while the reference clients are still coming)."""
        upload = self.chunk(upload)
        if not upload.client_ids:
            return []
        if self.norm_factor is None:
            return [upload]
        norms = update_norms(upload, self.reference)
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
            # even count: the mean of the two middle norms
            self.median = float(torch.quantile(norms[: self.reference_clients].double(), 0.5))
        return self._judged(held, norms)

    def _judged(self, upload: Upload, norms: torch.Tensor) -> list[Upload]:
        assert self.norm_factor is not None and self.median is not None
        ok = norms <= self.norm_factor * max(self.median, 1e-12)
        self.counts["rejected_norm"] += int((~ok).sum())
        upload = select(upload, ok)
        return [upload] if upload.client_ids else []


# ------------------------------------------------------------------ robust rules


def _flat(stacked: dict[str, torch.Tensor]) -> torch.Tensor:
    n = next(iter(stacked.values())).shape[0]
    return torch.cat([v.reshape(n, -1).double() for v in stacked.values()], 1)


def krum_scores(points: torch.Tensor, f: int) -> torch.Tensor:
    """Krum's score per point: the sum of squared distances to its n − f − 2 nearest others."""
    n = points.shape[0]
    dist = torch.cdist(points, points).pow(2)
    dist.fill_diagonal_(float("inf"))
    nearest = max(n - f - 2, 1)
    return dist.topk(min(nearest, n - 1), largest=False, dim=1).values.sum(1)


def byzantine_count(n: int, fraction: float) -> int:
    """f = ⌊fraction · n⌋, capped at (n − 3) // 2 so that Krum's n > 2f + 2 holds."""
    return max(0, min(int(math.floor(fraction * n)), (n - 3) // 2))


def robust_mean(stacked: dict[str, torch.Tensor], kind: str, trim_fraction: float = 0.1,
                byzantine_fraction: float = 0.1, keep: int | None = None,
                weights: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """Combine stacked client parameters ``[n, …]`` with a robust rule (unweighted).

    ``weights`` (Multi-Krum only): average the kept updates weighted by them (sample counts, as
    Flower's ``MultiKrum`` strategy does) instead of uniformly (as in Blanchard et al.).
    """
    n = next(iter(stacked.values())).shape[0]
    if kind == "median":
        return {k: v.median(0).values if n % 2 else v.sort(0).values[n // 2 - 1 : n // 2 + 1].mean(0)
                for k, v in stacked.items()}
    if kind == "trimmed_mean":
        cut = int(math.floor(trim_fraction * n))
        return {k: v.sort(0).values[cut : n - cut].mean(0) for k, v in stacked.items()}
    if kind in ("krum", "multi_krum"):
        f = byzantine_count(n, byzantine_fraction)
        scores = krum_scores(_flat(stacked), f)
        m = 1 if kind == "krum" else min(keep or n - f, n)
        chosen = scores.argsort(stable=True)[:m].to(next(iter(stacked.values())).device)
        if weights is None or kind == "krum":
            return {k: v[chosen].mean(0) for k, v in stacked.items()}
        w = weights.to(chosen.device)[chosen].double()
        w = w / w.sum()
        return {k: torch.tensordot(w.to(v.dtype), v[chosen], dims=1) for k, v in stacked.items()}
    raise ValueError(f"unknown aggregator {kind!r}: expected one of {AGGREGATORS}")


# ------------------------------------------------------------------ combining


def weighted_mean(old: Params, upload: Upload, uniform: bool = False) -> Params:
    """The (sample-weighted, or uniform) mean of the uploaded shared parameters."""
    if isinstance(upload, StreamedUpload):
        return {k: upload.mean[k].to(v.dtype) for k, v in old.items()}
    w = torch.ones_like(upload.num_samples) if uniform else upload.num_samples
    w = w / w.sum()
    return {k: torch.tensordot(w.to(upload.params[k].dtype), upload.params[k], dims=1) for k in old}


@dataclass(frozen=True)
class DPNoise:
    """DP-FedAvg's Gaussian noise: std ``z · S / m`` (uniform) or ``z · S · max n_k / Σ n`` (samples)."""

    noise_multiplier: float
    clip: float | None
    expected_clients: int  # m: the fixed denominator of the uniform estimator
    uniform: bool
    generator_seed: int


def combine(old: Params, upload: Upload, aggregator: str = "mean", server_lr: float = 1.0,
            trim_fraction: float = 0.1, byzantine_fraction: float = 0.1, keep: int | None = None,
            dp: DPNoise | None = None, weighted: bool = False) -> Params:
    """The new shared parameters: ``old + η · (aggregate − old)``.

    ``aggregate`` is the mean, a robust rule, or (``dp``) DP-FedAvg's estimator:
    uniform weighting divides the sum of clipped updates by the *expected* number of
    clients m (McMahan et al.'s fixed-denominator estimator, so the sensitivity is S/m
    whoever replied), then adds ``N(0, (z·S/m)²)`` to every coordinate.
    """
    if dp is not None:
        mean = weighted_mean(old, upload, dp.uniform)
        received = len(upload.client_ids)
        if dp.uniform:
            scale = received / max(dp.expected_clients, 1)
            std = dp.noise_multiplier * (dp.clip or 0.0) / max(dp.expected_clients, 1)
        else:
            n = upload.num_samples.double()
            scale = 1.0
            std = dp.noise_multiplier * (dp.clip or 0.0) * float(n.max() / n.sum())
        gen = torch.Generator().manual_seed(dp.generator_seed)
        avg = {}
        for k, v in old.items():
            avg[k] = mean[k] if scale == 1.0 else v + (mean[k] - v) * scale  # no noise, no clip: FedAvg exactly
            if std > 0:
                avg[k] = avg[k] + (torch.randn(v.shape, generator=gen, dtype=torch.float64) * std).to(v.device, v.dtype)
    elif aggregator == "mean":
        avg = weighted_mean(old, upload)
    else:
        avg = robust_mean({k: upload.params[k] for k in old}, aggregator, trim_fraction, byzantine_fraction, keep,
                          upload.num_samples if weighted else None)
    return {k: avg[k] if server_lr == 1.0 else v + server_lr * (avg[k] - v) for k, v in old.items()}
