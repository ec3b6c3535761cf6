"""``pathological`` [NIID-Bench's #C = k label skew, as Flower Datasets' ``PathologicalPartitioner``]: every client
holds exactly ``classes_per_client`` classes."""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from hetfed.config import PartitionConfig
from hetfed.errors import PartitionError
from hetfed.partition import Indices, register, require_clients
from hetfed.registry import ComponentParams

Assignment = Literal["first-deterministic", "deterministic", "random"]


class PathologicalParams(ComponentParams):
    classes_per_client: int = Field(2, ge=1, description="the (exact) number of classes each client holds")
    assignment: Assignment = Field(
        "first-deterministic", description="how classes go to clients: client k's first is class k mod C, the others "
                                           "drawn (Li et al.'s, every class used once K ≥ C); classes k … k+c−1 mod "
                                           "C; or all drawn")


def pathological(x: np.ndarray, y: np.ndarray, cfg: PartitionConfig, rng: np.random.Generator,
                 client_ids: np.ndarray | None = None) -> Indices:
    """Each client holds exactly ``classes_per_client`` classes; a class's samples are split in equal parts, in the
    pool's order, over the clients that hold it.

    The label skew "#C = k" of NIID-Bench (Li et al., ICDE 2022), drawn as Flower Datasets' ``PathologicalPartitioner``
    draws it: given a generator in the same state, the same clients get the same samples (tested against Flower
    Datasets' own class). A class that no client draws is refused rather than left out of the federation.
    """
    k = require_clients(cfg, len(y))
    per = cfg.params.classes_per_client
    classes = np.unique(y)
    if per > len(classes):
        raise PartitionError(f"partition.classes_per_client = {per} is not allowed: the data has {len(classes)} "
                             f"classes; expected at most {len(classes)}")
    held = _assign(k, per, classes, cfg.params.assignment, rng)
    times = {int(c): sum(int(c) in h for h in held) for c in classes}
    unused = [c for c, t in times.items() if t == 0]
    if unused:
        raise PartitionError(
            f"partition.kind = 'pathological' gives classes {unused} to no client ({k} clients × {per} classes, "
            f"assignment {cfg.params.assignment!r}): their samples would be left out; expected partition.clients ≥ "
            f"{len(classes)} with assignment 'first-deterministic' (every class is some client's first)")
    members = {c: np.flatnonzero(y == c) for c in times}
    for c, t in times.items():
        if t > len(members[c]):
            raise PartitionError(f"partition.kind = 'pathological' gives class {c} to {t} clients but it has only "
                                 f"{len(members[c])} samples; expected fewer clients or classes_per_client")
    parts: list[list[np.ndarray]] = [[] for _ in range(k)]
    for c, t in times.items():
        pieces = iter(np.array_split(members[c], t))
        for client in range(k):
            if c in held[client]:
                parts[client].append(next(pieces))
    return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def _assign(k: int, per: int, classes: np.ndarray, mode: Assignment, rng: np.random.Generator) -> list[list[int]]:
    """Each client's classes, drawn in Flower Datasets' order (one ``rng.choice`` a drawn class, a client after
    another)."""
    n = len(classes)
    if mode == "deterministic":
        return [[int(classes[(client + i) % n]) for i in range(per)] for client in range(k)]
    if mode == "random":
        return [[int(c) for c in rng.choice(classes, size=per, replace=False)] for _ in range(k)]
    held = []
    for client in range(k):
        mine = [int(classes[client % n])]
        while len(mine) < per:
            drawn = int(rng.choice(classes, size=1)[0])
            if drawn not in mine:
                mine.append(drawn)
        held.append(mine)
    return held


register("pathological", pathological, Params=PathologicalParams)
