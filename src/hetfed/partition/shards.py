"""``shards`` [Fed-FSNet, after McMahan et al.]: label-sorted shards, ``shards_per_client`` each (see the package's
docstring)."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from hetfed.config import PartitionConfig
from hetfed.errors import PartitionError
from hetfed.partition import (
    Indices,
    apportion,
    classes_present,
    register,
    require_clients,
)
from hetfed.registry import ComponentParams


class ShardsParams(ComponentParams):
    n_shards: int | None = Field(None, ge=1, description="shards in all (None: clients × shards_per_client)")
    shards_per_client: int = Field(2, ge=1, description="shards each client is dealt")
    shard_cut: Literal["within_class", "sorted"] = Field(
        "within_class", description="cut within each class (no shard straddles two labels), or McMahan et al.'s "
        "sort-by-label-and-cut into equal shards (a shard at a class boundary holds two labels)")


def shards(x: np.ndarray, y: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator,
           client_ids: np.ndarray | None = None) -> Indices:
    """Label-sorted shards, ``shards_per_client`` each, cut within classes."""
    k = require_clients(cfg, len(y))
    n_shards = cfg.params.n_shards if cfg.params.n_shards is not None else k * cfg.params.shards_per_client
    if n_shards != k * cfg.params.shards_per_client:
        raise PartitionError(
            f"partition.n_shards = {n_shards} is not allowed with {k} clients × "
            f"{cfg.params.shards_per_client} shards each: expected {k * cfg.params.shards_per_client} "
            "(or leave n_shards unset)"
        )
    classes = classes_present(y)
    if n_shards < len(classes):
        raise PartitionError(
            f"partition.n_shards = {n_shards} is not allowed: the data has {len(classes)} classes "
            f"and every class needs a shard; expected n_shards ≥ {len(classes)}"
        )
    if n_shards > len(y):
        raise PartitionError(f"partition.n_shards = {n_shards} is not allowed: more shards than the {len(y)} samples")
    # McMahan et al.: sort by label (random order within a label), cut equal shards
    if cfg.params.shard_cut == "sorted":
        by_label = np.concatenate([rng.permutation(np.flatnonzero(y == c)) for c in classes])
        return _deal(np.array_split(by_label, n_shards), k, cfg.params.shards_per_client, rng)
    sizes = np.array([(y == c).sum() for c in classes])
    per_class = 1 + apportion(n_shards - len(classes), sizes)  # every class gets ≥ 1 shard
    per_class = np.minimum(per_class, sizes)  # a shard is never empty
    for _ in range(n_shards - int(per_class.sum())):  # give what tiny classes could not take
        per_class[np.argmax(sizes - per_class)] += 1
    pieces: list[np.ndarray] = []
    for c, m in zip(classes, per_class, strict=True):
        idx = rng.permutation(np.flatnonzero(y == c))
        pieces.extend(np.array_split(idx, m))
    return _deal(pieces, k, cfg.params.shards_per_client, rng)


def _deal(pieces: list[np.ndarray], k: int, s: int, rng: np.random.Generator) -> Indices:
    """Give each of k clients s shards drawn at random without replacement."""
    order = rng.permutation(len(pieces))
    return [np.sort(np.concatenate([pieces[j] for j in order[i * s : (i + 1) * s]])) for i in range(k)]


register("shards", shards, Params=ShardsParams)
