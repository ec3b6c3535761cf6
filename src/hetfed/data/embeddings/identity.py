"""``identity``: the samples as they are, flattened (images, vectors; Shakespeare's character windows)."""

from __future__ import annotations

from hetfed.config import EmbedConfig
from hetfed.data.embed import Embedded, flat, wrap
from hetfed.data.embeddings import EmbeddingKind, register
from hetfed.data.loading import Dataset


def identity(ds: Dataset, cfg: EmbedConfig, progress: bool) -> Embedded:
    return wrap(ds, flat(ds.x_train), flat(ds.x_test), ds.input_shape, "identity")


register(EmbeddingKind("identity", identity, "the samples themselves, flattened", ("image", "vector", "sequence"),
                       gives=None))
