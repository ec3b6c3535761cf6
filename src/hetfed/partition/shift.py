"""Skews applied beside any partitioner, to the clients' own samples after the split: noise on the features
(NIID-Bench), rotated images and swapped labels (concept shift: what clustered FL is built for).

Each returns a copy of the pool (a sweep's runs share the one they were given); the global test set is never
touched, so it stays the dataset's own: group 0's concept when group 0 is left as it is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import numpy as np

from hetfed.config import PartitionConfig
from hetfed.errors import PartitionError

Indices = list[np.ndarray]
T = TypeVar("T")


def client_groups(n_clients: int, n_groups: int) -> np.ndarray:
    """Client k's group, ⌊k·G/K⌋: G contiguous groups of near-equal size, the first clients in group 0 — as IFCA's
    code assigns its machines to clusters and CFL's example rotates its first half."""
    return np.arange(n_clients) * n_groups // n_clients


def with_feature_noise(x: np.ndarray, parts: Indices, scale: float, rng: np.random.Generator) -> np.ndarray:
    """A copy of the pool ``x`` whose rows of client k carry Gaussian noise of standard deviation ``scale · k/(K−1)``
    (NIID-Bench's noise-based feature skew, Li et al., ICDE 2022: client 0 clean, the last ``scale``). Drawn once per
    sample, where NIID-Bench draws it afresh each time a sample is loaded: the same distribution per client, without
    that augmentation."""
    noisy = x.copy()
    for k, rows in enumerate(parts):
        std = scale * k / max(len(parts) - 1, 1)
        if std and len(rows):
            noisy[rows] += rng.normal(0.0, std, size=(len(rows), *x.shape[1:])).astype(x.dtype)
    return noisy


def per_client(n_clients: int, per_group: Sequence[T] | None) -> list[T | None]:
    """What each client's group (:func:`client_groups`) is given in ``per_group`` (None for every client: none)."""
    if per_group is None:
        return [None] * n_clients
    return [per_group[g] for g in client_groups(n_clients, len(per_group))]


def with_rotations(x: np.ndarray, parts: Indices, degrees: Sequence[int], shape: tuple[int, ...]) -> np.ndarray:
    """A copy of the pool ``x`` (flattened images of ``shape``, the last two axes height and width) whose rows of
    the clients of group g (:func:`client_groups`) are rotated ``degrees[g]`` counter-clockwise — IFCA's rotated
    MNIST (Ghosh et al., NeurIPS 2020: four groups at 0/90/180/270°, ``torch.rot90`` on the image axes) and CFL's
    example (Sattler et al.: half the clients at 180°)."""
    out = x.copy()
    for rows, angle in zip(parts, per_client(len(parts), degrees), strict=True):
        if angle and len(rows):
            images = x[rows].reshape(len(rows), *shape)
            out[rows] = np.rot90(images, angle // 90, axes=(-2, -1)).reshape(len(rows), -1)
    return out


def with_label_swaps(y: np.ndarray, parts: Indices, swaps: Sequence[Sequence[int] | None]) -> np.ndarray:
    """A copy of the labels ``y`` in which the clients of group g (:func:`client_groups`) have the two labels of
    ``swaps[g]`` exchanged (None: none): the same features meaning another class on some clients — the concept
    shift of clustered FL's label-swap experiments (Kairouz et al.'s "same features, different label")."""
    out = y.copy()
    for rows, pair in zip(parts, per_client(len(parts), swaps), strict=True):
        if pair is not None and len(rows):
            a, b = pair
            out[rows] = np.where(y[rows] == a, b, np.where(y[rows] == b, a, y[rows]))
    return out


def shifted(data, x: np.ndarray, y: np.ndarray, parts: Indices, cfg: PartitionConfig,
            seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The pool's features and labels with ``cfg``'s skews applied to the clients of ``parts`` — each checked
    before any is applied (:func:`_check`), so a refused one copies nothing."""
    shape = tuple(getattr(data, "input_shape", x.shape[1:]))
    _check(data, x, parts, cfg, shape)
    if cfg.feature_noise:
        x = with_feature_noise(x, parts, cfg.feature_noise, np.random.default_rng([seed, 0x401E]))
    if cfg.rotations is not None:
        x = with_rotations(x, parts, cfg.rotations, shape)
    if cfg.label_swaps is not None:
        y = with_label_swaps(y, parts, cfg.label_swaps)
    return x, y


def _check(data, x: np.ndarray, parts: Indices, cfg: PartitionConfig, shape: tuple[int, ...]) -> None:
    """Refuse, in one line, a skew that cannot apply: to inputs that are not features or not images, with more
    groups than clients, naming a label the data does not have."""
    extractor = getattr(data, "extractor", None)
    features = getattr(data, "measure_train", None) is None and np.issubdtype(x.dtype, np.floating)
    if cfg.feature_noise and not features:  # token ids, characters, raw text
        raise PartitionError(f"partition.feature_noise = {cfg.feature_noise} is not allowed with embed.kind = "
                             f"{extractor!r}: its inputs are not features (token ids, "
                             "text); expected real-valued features (e.g. embed.kind = 'minilm')")
    if cfg.feature_noise and len(parts) < 2:
        raise PartitionError(f"partition.feature_noise = {cfg.feature_noise} is not allowed with one client: "
                             "client 0's features stay clean, so nothing would be skewed; expected "
                             "partition.clients ≥ 2")
    for key, groups in (("rotations", cfg.rotations), ("label_swaps", cfg.label_swaps)):
        if groups is not None and len(groups) > len(parts):
            raise PartitionError(f"partition.{key} = {groups} is not allowed with {len(parts)} clients: it names "
                                 f"{len(groups)} groups and a group needs a client; expected at most "
                                 f"{len(parts)} entries")
    if cfg.rotations is not None:
        if not features or len(shape) < 2 or extractor not in (None, "identity"):
            raise PartitionError(f"partition.rotations = {cfg.rotations} is not allowed with embed.kind = "
                                 f"{extractor!r} and samples of shape {shape}: it rotates images; expected an image "
                                 "dataset with embed.kind = 'identity'")
        if shape[-1] != shape[-2] and any(d % 180 for d in cfg.rotations):
            raise PartitionError(f"partition.rotations = {cfg.rotations} is not allowed with {shape[-2]}×{shape[-1]} "
                                 "images: a quarter turn changes their shape; expected 0 or 180 only")
    bad = [v for pair in cfg.label_swaps or [] if pair is not None for v in pair if not 0 <= v < data.n_classes]
    if bad:
        raise PartitionError(f"partition.label_swaps = {cfg.label_swaps} names label {bad[0]}, which "
                             f"{getattr(data, 'name', 'the dataset')!r} does not have: expected labels 0 … "
                             f"{data.n_classes - 1}")


def _concepts(n_clients: int, params: dict) -> list[tuple[int | None, tuple[int, ...] | None]] | None:
    """Each client's (angle, swapped pair) from a federation's partition settings; None when there are none."""
    rotations, swaps = params.get("rotations"), params.get("label_swaps")
    if rotations is None and swaps is None:
        return None
    pairs = [None if p is None else tuple(p) for p in per_client(n_clients, swaps)]
    return list(zip(per_client(n_clients, rotations), pairs, strict=True))


def concept_groups(n_clients: int, params: dict) -> np.ndarray | None:
    """Each client's concept, from a federation's partition settings (``params``: ``rotations``, ``label_swaps``):
    clients whose samples are turned alike and whose labels are swapped alike share one (two groups at the same
    angle are one concept), numbered as they first come; None when the partition made none."""
    keys = _concepts(n_clients, params)
    if keys is None:
        return None
    numbers: dict[tuple, int] = {}  # numbered as they first come: the first clients' concept is 0
    return np.array([numbers.setdefault(k, len(numbers)) for k in keys])


def concept_names(n_clients: int, params: dict) -> list[str] | None:
    """Each client's concept in words (``turned 90°, labels 1↔7``; ``as is``), for the partition's table."""
    keys = _concepts(n_clients, params)
    if keys is None:
        return None
    return [", ".join([*([f"turned {a}°"] if a else []), *([f"labels {p[0]}↔{p[1]}"] if p else [])]) or "as is"
            for a, p in keys]
