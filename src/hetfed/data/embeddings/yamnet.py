"""``yamnet``: YAMNet's 1024-d clip embeddings (weights: the file embed.weights names)
(:mod:`hetfed.data.extractors`)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from pydantic import Field

from hetfed.config import EmbedConfig
from hetfed.data import extractors
from hetfed.data.embed import Embedded, extracted
from hetfed.data.embeddings import EmbeddingKind, register
from hetfed.data.loading import Dataset
from hetfed.registry import ComponentParams


class YamnetParams(ComponentParams):
    weights: str | None = Field(None, description="the converted weights file (see the README's Data section)")


def embed_yamnet(ds: Dataset, cfg: EmbedConfig, progress: bool) -> Embedded:
    """The cache is keyed by the weights file's content: other weights never reuse another's features."""
    from hetfed.data import yamnet

    yamnet.load_weights(cfg.params.weights)  # fails here, before any clip is read, if they are missing or wrong
    digest = hashlib.sha256(Path(os.path.expanduser(str(cfg.params.weights))).read_bytes()).hexdigest()[:16]
    params = {"weights_sha256": digest, "pool": "max", "remainder": "drop"}
    return extracted(ds, cfg, extractors.yamnet, params, progress)


register(EmbeddingKind("yamnet", embed_yamnet,
                       "YAMNet's 1024-d clip embeddings (weights: the file embed.weights names)", ("audio",),
                       Params=YamnetParams))
