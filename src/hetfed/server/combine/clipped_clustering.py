"""Clipped clustering (Li, Ngai and Voigt, "An experimental study of Byzantine-robust aggregation schemes in federated
learning", IEEE Transactions on Big Data 2023), as Blades' ``Clippedclustering`` (its authors' benchmark): each update
clipped to τ, the median of the norms of every update the server has received so far (this round's included; at most
``max_tau``); the clipped updates split in two by agglomerative clustering on their pairwise cosine distances
(scikit-learn's, ``linkage`` average); the mean of the larger group.

Clipping first bounds what a large malicious update can do; clustering by direction then separates updates that point
elsewhere, whatever their norm. The norms' history lives in the server's state (its checkpoints): one number per
update received. As Blades: an update above τ is scaled by τ/(‖Δ‖ + 10⁻⁶) (its ``clip_tensor_norm_``); a pair whose
cosine is undefined (an update of norm 0) is at distance 2; the group labelled 1 is kept when it holds more than half
of the updates, label 0's otherwise (so on a tie); a round of one update keeps it. Its weights (:class:`Weighed`):
1/|kept| each (then clipped), 0 for the others. The history grows by a round's updates every round (8 bytes each):
20 clients × 2 000 rounds keep 320 kB."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field

from hetfed.engine.types import Params, Upload, flat, flat_one, unflat
from hetfed.server.combine import CombineRule, RuleParams, Weighed, register


class ClippedClusteringParams(RuleParams):
    max_tau: float = Field(1e5, gt=0, description="the clipping bound's ceiling (Blades' 1e5: in effect none)")
    linkage: Literal["average", "single"] = Field("average", description="the agglomerative clustering's linkage "
                                                                         "(Blades' average)")


def larger_group(points: torch.Tensor, linkage: str) -> np.ndarray:
    """The rows of the larger of two groups agglomerative clustering makes of ``points`` by cosine distance (label
    0's on a tie, as Blades'); every row when there are fewer than two."""
    n = len(points)
    if n < 2:
        return np.arange(n)
    from sklearn.cluster import AgglomerativeClustering

    unit = points / torch.linalg.vector_norm(points, dim=1, keepdim=True)
    distances = (1.0 - unit @ unit.T).nan_to_num(2.0).cpu().numpy()  # an update of norm 0: distance 2
    np.fill_diagonal(distances, 0.0)
    labels = AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage=linkage).fit(distances).labels_
    flag = 1 if labels.sum() > n // 2 else 0
    return np.flatnonzero(labels == flag)


def clipped_clustering(old: Params, upload: Upload, params: ClippedClusteringParams,
                       state: dict[str, Any]) -> tuple[Weighed, dict[str, Any]]:
    reference = flat_one(old).to(next(iter(upload.params.values())).device)
    deltas = flat({k: upload.params[k] for k in old}) - reference
    norms = torch.linalg.vector_norm(deltas, dim=1)
    history = torch.cat([state.get("norms", torch.zeros(0, dtype=torch.float64)), norms.cpu()])
    bound = min(float(np.median(history.numpy())), params.max_tau)
    scale = torch.where(norms > bound, bound / (norms + 1e-6), torch.ones_like(norms))
    clipped = deltas * scale.unsqueeze(1)
    chosen = larger_group(clipped, params.linkage)
    value = reference + clipped[torch.as_tensor(chosen, device=deltas.device)].mean(0)
    return Weighed.averaging(unflat(value, old, upload.params), chosen.tolist(), len(deltas)), {"norms": history}


register(CombineRule("clipped_clustering", clipped_clustering, ClippedClusteringParams, streams=False, remembers=True,
                     summary="updates clipped to the median of every norm seen so far, split in two by agglomerative "
                             "clustering on cosine distance; the mean of the larger group",
                     paper="Li et al. 2023"))
