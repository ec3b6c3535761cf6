"""SignGuard (Xu, Huang, Song and Lan, "Byzantine-robust federated learning through collaborative malicious gradient
filtering", ICDCS 2022), as its authors' code (JianXu95/SignGuard, ``signguard_multiclass``): two filters, each blind to
what the other sees, and the mean of the updates both keep, clipped.

- **Norm filter**: an update is kept when its norm lies strictly between ``lower``·M and ``upper``·M, M the median of
  the round's update norms (the authors' 0.1 and 3.0; numpy's median, the mean of the middle two for an even count).
- **Sign filter**: on a window of ⌊``coordinates``·d⌋ consecutive coordinates at a random start (the authors' 10 %;
  drawn from the run seed and the round), each update's shares of positive, zero and negative signs, each share
  divided by its largest over the updates; MeanShift (scikit-learn's; bandwidth ``estimate_bandwidth`` at quantile 0.5
  over at most 50 updates, bin seeding, orphans left unlabelled) clusters those points, and the largest cluster is
  kept. Crafted updates whose signs are skewed otherwise than the honest ones' (ALIE's bias in every coordinate,
  IPM's scaled negative mean where honest updates are not balanced) shift these shares, whatever their norm; a sign
  flip of updates with as many positive as negative coordinates does not.
- **Aggregate**: every update clipped to the median norm (torch's: the lower middle one for an even count, as the
  authors' code) and the kept ones averaged, unweighted.

Where the authors' code has no answer, this one says what it does: when every update's sign shares are alike the
bandwidth estimate is 0 and MeanShift cannot run — the largest group of equal points is the cluster; when the two
filters keep no update in common, the updates the norm filter kept are averaged, and when it kept none, all of them.
Its weights (:class:`Weighed`): 1/|kept| each (then clipped), 0 for the others."""

from __future__ import annotations

import warnings

import numpy as np
import torch
from pydantic import Field, model_validator

from hetfed.engine.types import Params, Upload, flat, flat_one, unflat
from hetfed.server.combine import CombineRule, RuleParams, Weighed, register


class SignGuardParams(RuleParams):
    lower: float = Field(0.1, ge=0, description="an update whose norm is not above lower·M (M the median norm) is left "
                                                "out (the authors' 0.1)")
    upper: float = Field(3.0, gt=0, description="an update whose norm is not below upper·M is left out (the authors' "
                                                "3.0)")
    coordinates: float = Field(0.1, gt=0, le=1, description="the share of the coordinates whose signs are clustered, "
                                                           "a window at a random start (the authors' 0.1)")

    @model_validator(mode="after")
    def _bounds_in_order(self) -> SignGuardParams:
        if self.lower >= self.upper:
            raise ValueError(f"lower = {self.lower:g} must be below upper = {self.upper:g}: no update would pass")
        return self


def norm_filter(norms: np.ndarray, lower: float, upper: float) -> np.ndarray:
    """Whether each update's norm lies strictly between ``lower`` and ``upper`` times their median."""
    median = np.median(norms)
    kept: np.ndarray = (norms > lower * median) & (norms < upper * median)
    return kept


def sign_features(window: torch.Tensor) -> np.ndarray:
    """Each row's shares of positive, zero and negative values, each share divided by its largest over the rows — in
    float32, as the authors' code: the shares lie on a grid of multiples of 1/width, so distances between points can
    equal the bandwidth estimated from them, and float32's rounding decides those ties as theirs does."""
    signs = torch.sign(window)
    shares = torch.stack([signs.eq(s).sum(1, dtype=torch.float32) / window.shape[1] for s in (1.0, 0.0, -1.0)], 1)
    return (shares / (shares.max(0).values + 1e-8)).cpu().numpy()


def largest_cluster(points: np.ndarray) -> np.ndarray:
    """Whether each point is in MeanShift's most populous cluster (the authors' settings); the largest group of equal
    points when the bandwidth estimate is 0 (MeanShift needs a positive one)."""
    from sklearn.cluster import MeanShift, estimate_bandwidth

    bandwidth = estimate_bandwidth(points, quantile=0.5, n_samples=50)
    if bandwidth > 0:
        with warnings.catch_warnings():  # "binning data failed": MeanShift seeds from every point, as it then does
            warnings.simplefilter("ignore", UserWarning)  # in the authors' runs; nothing for a user to act on
            labels = MeanShift(bandwidth=bandwidth, bin_seeding=True, cluster_all=False).fit(points).labels_
    else:
        labels = np.unique(points, axis=0, return_inverse=True)[1].reshape(-1)
    counts = np.bincount(labels[labels >= 0], minlength=1)
    largest: np.ndarray = labels == int(np.argmax(counts))
    return largest


def signguard(old: Params, upload: Upload, params: SignGuardParams, rng: torch.Generator) -> Weighed:
    reference = flat_one(old).to(next(iter(upload.params.values())).device)
    deltas = flat({k: upload.params[k] for k in old}) - reference
    n, d = deltas.shape
    norms = torch.linalg.vector_norm(deltas, dim=1)
    by_norm = norm_filter(norms.cpu().numpy(), params.lower, params.upper)
    width = max(1, int(params.coordinates * d))
    start = int(torch.randint(0, max(1, d - width), (1,), generator=rng))
    by_sign = largest_cluster(sign_features(deltas[:, start:start + width]))
    chosen = np.flatnonzero(by_norm & by_sign)
    if not len(chosen):
        chosen = np.flatnonzero(by_norm) if by_norm.any() else np.arange(n)
    bound = norms.median()  # the lower middle norm for an even count (torch's), as the authors' clip
    scale = (bound / norms).nan_to_num(1.0, 1.0).clamp(max=1.0)  # an update of norm 0 stays 0
    kept = torch.as_tensor(chosen, device=deltas.device)
    value = reference + (deltas[kept] * scale[kept].unsqueeze(1)).mean(0)
    return Weighed.averaging(unflat(value, old, upload.params), chosen.tolist(), n)


register(CombineRule("signguard", signguard, SignGuardParams, streams=False, draws=True,
                     summary="updates kept by a median-norm band and by MeanShift on their sign shares; clipped to "
                             "the median norm and averaged",
                     paper="Xu et al. 2022"))
