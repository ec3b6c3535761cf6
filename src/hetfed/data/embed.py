"""The embed step: raw data → fixed feature vectors, by a frozen extractor.

The CGAU method trains a small classifier on embeddings of a pre-trained network
that is never trained further; embedding once and caching the result on disk
means a sweep of many runs pays for extraction once. ``identity`` and ``pca`` are
cheap and not cached; the neural extractors are cached, keyed by dataset content
+ extractor + its parameters.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hetfed.config import EmbedConfig
from hetfed.data.loading import Dataset
from hetfed.errors import DataError


@dataclass(frozen=True, eq=False)
class Embedded:
    """Flattened float32 features for train and test, plus what the model needs."""

    name: str
    x_train: np.ndarray  # N × d, float32
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    n_classes: int
    input_shape: tuple[int, ...]  # shape of one sample before flattening (for CNNs)
    client_train: np.ndarray | None = None
    extractor: str = "identity"
    #: features Γ and feature clustering read when x is not a feature vector (token ids); None: x itself
    measure_train: np.ndarray | None = None
    sequence_gap: int | None = None  # see hetfed.data.loading.Dataset
    balanced_test: bool = True
    notes: tuple[str, ...] = ()
    class_names: tuple[str, ...] = ()  # label names by class id, where the data has them


def embed(ds: Dataset, cfg: EmbedConfig, *, progress: bool = True) -> Embedded:
    """Apply the configured extractor (:mod:`hetfed.data.embeddings`); neural extractors go through the disk
    cache. An extractor that does not take the dataset's kind of samples is refused, naming those that do."""
    from hetfed.registry import registry_of

    kinds = registry_of("embedding")
    kind = kinds.get(cfg.kind, "embed.kind")
    if ds.modality not in kind.accepts:
        takers = ", ".join(repr(name) + (f" (pip install 'hetfed[{k.extra}]')" if k.extra else "")
                           for name, k in kinds.items() if ds.modality in k.accepts)
        raise DataError(f"embed.kind = {cfg.kind!r} cannot be used on {ds.modality} dataset {ds.name!r}: it embeds "
                        f"{' / '.join(kind.accepts)} samples; expected embed.kind {takers}")
    return kind.embed(ds, cfg, progress)


def extracted(ds: Dataset, cfg: EmbedConfig, fn: Callable[..., np.ndarray], params: dict,
              progress: bool) -> Embedded:
    """A neural extractor's features of the train and test splits, through the disk cache (keyed by the data's
    content, the extractor and ``params``: what changes its output)."""
    arrays = cached(cache_path(ds, cfg.kind, params, cfg.cache_dir), lambda: {
        "train": fn(ds.x_train, cfg, progress=progress, desc=f"embed {ds.name} train"),
        "test": fn(ds.x_test, cfg, progress=progress, desc=f"embed {ds.name} test"),
    })
    tr, te = arrays["train"], arrays["test"]
    return wrap(ds, tr, te, (tr.shape[1],), cfg.kind)


def cached(path: Path, make: Callable[[], dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The arrays saved at ``path``, or ``make()``'s, saved there first (atomically)."""
    if path.is_file():
        with np.load(path) as z:
            return {k: z[k] for k in z.files}
    arrays = make()
    _atomic_save(path, **arrays)
    return arrays


def flat(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x.reshape(len(x), -1), dtype=np.float32)


def wrap(ds: Dataset, tr: np.ndarray, te: np.ndarray, shape: tuple[int, ...], kind: str) -> Embedded:
    measure = None
    if ds.modality == "sequence":  # character ids are codes, not features: Γ reads each window's characters
        from hetfed.data.shakespeare import character_histograms

        measure = character_histograms(ds.x_train)
    return Embedded(
        ds.name, tr.astype(np.float32), ds.y_train, te.astype(np.float32), ds.y_test,
        ds.n_classes, shape, ds.client_train, kind, measure_train=measure, sequence_gap=ds.sequence_gap,
        balanced_test=ds.balanced_test, notes=ds.notes, class_names=ds.class_names,
    )


def default_cache_dir() -> Path:
    env = os.environ.get("HETFED_CACHE")
    return Path(env) if env else Path("~/.cache/hetfed/embeddings").expanduser()


def dataset_fingerprint(ds: Dataset) -> str:
    """A content hash of the raw data, so a changed file never reuses a stale cache."""
    h = hashlib.sha256()
    for arr in (ds.x_train, ds.y_train, ds.x_test, ds.y_test):
        if arr.dtype == object:
            for s in arr:
                h.update(str(s).encode())
                if ds.modality == "audio":  # x holds paths: a changed clip must not reuse the cache
                    st = os.stat(s)
                    h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
        else:
            h.update(str(arr.shape).encode())
            h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()[:16]


def cache_path(ds: Dataset, kind: str, params: dict, cache_dir: str | None) -> Path:
    """Cache file name: dataset + extractor + its parameters + content hash."""
    key = json.dumps({"kind": kind, "params": params, "data": dataset_fingerprint(ds)}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    folder = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    return folder / f"{ds.name}-{kind}-{digest}.npz"


def _atomic_save(path: Path, **arrays: np.ndarray) -> None:
    """Write to a temporary file and rename, so a crash never leaves a bad cache."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp.npz")
    os.close(fd)
    try:
        np.savez(tmp, **arrays)  # type: ignore[arg-type]  # numpy's stub types **arrays as allow_pickle
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
