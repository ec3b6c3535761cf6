"""``feature_clusters`` [CGAU]: clients are regions of the (PCA-reduced) feature space, with a ``shuffle`` fraction
reassigned."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from hetfed.config import PartitionConfig
from hetfed.errors import PartitionError
from hetfed.partition import Indices, classes_present, pca_view, register, require_clients
from hetfed.registry import ComponentParams


class FeatureClustersParams(ComponentParams):
    shuffle: float = Field(0.0, ge=0, le=1, description="the fraction of samples reassigned to uniformly random "
                                                        "clients (1: IID)")
    pca_components: int = Field(2, ge=1, description="the PCA plane the per-class k-means clusters are found in")


def feature_clusters(x: np.ndarray, y: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator,
                     client_ids: np.ndarray | None = None) -> Indices:
    """The CGAU simulation: clients are regions of the (PCA'd) embedding space."""
    k = require_clients(cfg, len(y))
    assign = cluster_assignment(x, y, k, cfg.params.pca_components, rng)
    assign = reassign_fraction(assign, cfg.params.shuffle, k, rng)
    return [np.flatnonzero(assign == c).astype(np.int64) for c in range(k)]


def cluster_assignment(x: np.ndarray, y: np.ndarray, k: int, components: int, rng: np.random.Generator) -> np.ndarray:
    """Client of every sample before shuffling: its class's nearest matched centroid."""
    from scipy.optimize import linear_sum_assignment
    from scipy.spatial.distance import cdist

    from hetfed.partition._kmeans import kmeans

    z = pca_view(x, components, seed=int(rng.integers(2**31)))
    assign = np.empty(len(y), dtype=np.int64)
    anchors: np.ndarray | None = None
    # sklearn's Lloyd iterations sum chunks of 256 samples in per-thread buffers, so with more OpenMP threads the
    # centroids' last bits — and, near a tie, a sample's client — depend on the core count: seed 0 of
    # Fashion-MNIST's default split moved 30 samples between 1 and 2 threads. One thread (``kmeans``'s) gives every
    # machine, a sweep's --jobs workers and every Flower node the same clients.
    for n_matched, c in enumerate(classes_present(y)):
        idx = np.flatnonzero(y == c)
        if len(idx) < k:
            raise PartitionError(
                f"partition.clients = {k} is not allowed with partition.kind = 'feature_clusters': "
                f"class {c} has only {len(idx)} samples and needs one cluster per client; "
                f"expected clients ≤ {len(idx)}"
            )
        labels, centroids = kmeans(z[idx], k, 4, int(rng.integers(2**31)))
        if anchors is None:
            to_client = np.arange(k)
            anchors = centroids.copy()
        else:
            rows, cols = linear_sum_assignment(cdist(centroids, anchors))
            to_client = np.empty(k, dtype=np.int64)
            to_client[rows] = cols
            anchors[cols] = (anchors[cols] * n_matched + centroids[rows]) / (n_matched + 1)
        assign[idx] = to_client[labels]
    return assign


def reassign_fraction(assign: np.ndarray, fraction: float, k: int, rng: np.random.Generator) -> np.ndarray:
    """Move ``round(fraction·N)`` random samples to uniformly random clients."""
    out = assign.copy()
    n_move = int(round(fraction * len(out)))
    if n_move:
        chosen = rng.choice(len(out), size=n_move, replace=False)
        out[chosen] = rng.integers(0, k, size=n_move)
    return out


register("feature_clusters", feature_clusters, Params=FeatureClustersParams)
