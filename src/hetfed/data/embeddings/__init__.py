"""The embedding registry: what ``embed.kind`` names — the frozen extractor between loading and partitioning,
one module of this package each.

An embedding module registers an :class:`EmbeddingKind`: ``embed(ds, cfg, progress) -> Embedded`` (the shared
machinery — the disk cache, wrapping — is :mod:`hetfed.data.embed`), the kinds of samples it takes
(``accepts``: a dataset's modality), what it gives the model (``gives``: feature vectors, or token ids only a
sequence model reads), and its own parameters (``Params``: the keys that sit beside ``embed.kind``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hetfed.config import EmbedConfig
from hetfed.data.embed import Embedded
from hetfed.data.loading import Dataset
from hetfed.registry import ComponentParams, Registry, describe_params


@dataclass(frozen=True)
class EmbeddingKind:
    """One registered extractor. ``gives``: ``"features"`` (vectors any classifier reads), ``"tokens"`` (token
    ids), or ``None``: the dataset's own samples, whatever they are (``identity``). ``fitted``: fitted on the
    federation's training split (PCA, a vocabulary), so it cannot embed another dataset the same way."""

    name: str
    embed: Callable[[Dataset, EmbedConfig, bool], Embedded]
    summary: str
    accepts: tuple[str, ...]
    gives: str | None = "features"
    Params: type[ComponentParams] = ComponentParams
    fitted: bool = False
    extra: str = ""  # the optional extra it needs (pip install 'hetfed[extra]'), if any


def _described(kind: EmbeddingKind) -> dict[str, Any]:
    return {"summary": kind.summary, "accepts": list(kind.accepts), "gives": kind.gives,
            "params": describe_params(kind.Params),
            **({"extra": kind.extra} if kind.extra else {})}


#: every extractor, by ``embed.kind`` (one module of this package each)
EMBEDDINGS: Registry[EmbeddingKind] = Registry("embedding", __name__, "embed.kind", describe=_described)


def register(kind: EmbeddingKind) -> EmbeddingKind:
    return EMBEDDINGS.register(kind.name, kind)
