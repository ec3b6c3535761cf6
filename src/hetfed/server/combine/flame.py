"""FLAME (Nguyen et al., "FLAME: Taming backdoors in federated learning", USENIX Security 2022), Algorithm 1: the
clients' models W_i clustered by their pairwise cosine distances with HDBSCAN (``min_cluster_size`` n/2 + 1,
``min_samples`` 1, one cluster allowed), so that only a majority of alike models is admitted; each admitted model's
update clipped to S, the median of all n updates' norms ‖W_i − G‖; their plain mean; then Gaussian noise of standard
deviation λ·S added to every parameter (λ = 0.001, the paper's for image classification; 0.01 for its NLP tasks).

Clustered on the local models, as the paper's algorithm says (``cosine_of: models``); implementations such as Blades'
and FLPoison's cluster the updates instead (``cosine_of: updates``). HDBSCAN is scikit-learn's; when it admits no
cluster (every model an outlier, which the paper does not say what to do with) every model is admitted. The noise is
drawn from the run seed and the round. Its weights (:class:`Weighed`): 1/|admitted| for each admitted model (its
update then clipped), 0 for the others."""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field

from hetfed.engine.types import Params, Upload, flat, flat_one, unflat
from hetfed.server.combine import CombineRule, RuleParams, Weighed, register
from hetfed.server.combine.median import coordinate_median


class FlameParams(RuleParams):
    noise: float = Field(0.001, ge=0, description="λ: the noise's standard deviation is λ·S (the paper's 0.001 for "
                                                  "image classification, 0.01 for NLP; 0: no noise)")
    cosine_of: Literal["models", "updates"] = Field("models", description="what is clustered by cosine distance: "
                                                                          "the local models (the paper's) or updates")


def admitted(points: np.ndarray) -> np.ndarray:
    """The rows HDBSCAN puts in the cluster of a majority (FLAME's filter) by cosine distance; all when it finds none
    or there are fewer than three."""
    n = len(points)
    if n < 3:
        return np.arange(n)
    from sklearn.cluster import HDBSCAN
    from sklearn.metrics.pairwise import cosine_distances

    distances = np.clip(cosine_distances(points), 0.0, None)
    labels = HDBSCAN(min_cluster_size=n // 2 + 1, min_samples=1, metric="precomputed",
                     allow_single_cluster=True, copy=False).fit_predict(distances)
    clusters = [c for c in np.unique(labels) if c >= 0]
    if not clusters:
        return np.arange(n)
    largest = max(clusters, key=lambda c: int((labels == c).sum()))
    return np.flatnonzero(labels == largest)


def flame(old: Params, upload: Upload, params: FlameParams, rng: torch.Generator) -> Weighed:
    models = flat({k: upload.params[k] for k in old})  # [n, d] float64
    reference = flat_one(old).to(models.device)
    deltas = models - reference
    chosen = admitted((models if params.cosine_of == "models" else deltas).cpu().numpy())
    norms = torch.linalg.vector_norm(deltas, dim=1)
    bound = coordinate_median(norms)  # S: for an even count the mean of the two middle norms
    kept = deltas[torch.as_tensor(chosen, device=deltas.device)]
    scale = (bound / torch.linalg.vector_norm(kept, dim=1)).nan_to_num(1.0, 1.0).clamp(max=1.0)  # a zero update: 1
    value = reference + (kept * scale.unsqueeze(1)).mean(0)
    if params.noise:
        value = value + params.noise * bound * torch.randn(value.shape, generator=rng, dtype=torch.float64).to(
            value.device)
    return Weighed.averaging(unflat(value, old, upload.params), chosen.tolist(), len(models))


register(CombineRule("flame", flame, FlameParams, streams=False, draws=True,
                     summary="HDBSCAN on cosine distances admits a majority; updates clipped to the median norm; "
                             "their mean, plus noise λ·S",
                     paper="Nguyen et al. 2022"))
