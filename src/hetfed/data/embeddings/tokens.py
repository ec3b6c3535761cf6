"""``tokens``: token ids from a vocabulary fitted on the training texts — the inputs of ``model.kind: bilstm``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hetfed.config import EmbedConfig
from hetfed.data.embed import Embedded, cache_path, cached, wrap
from hetfed.data.embeddings import EmbeddingKind, register
from hetfed.data.loading import Dataset


def token_ids(ds: Dataset, cfg: EmbedConfig, progress: bool) -> Embedded:
    """Token ids from a vocabulary fitted on the training texts, cached like an extractor's output."""
    from hetfed.data import tokens

    params = {"max_length": cfg.max_length, "vocab_size": cfg.vocab_size, "min_count": cfg.min_count,
              "words": f"sklearn-lower-{tokens.WORD_PATTERN}", "lsa": tokens.LSA_COMPONENTS}

    def make() -> dict[str, np.ndarray]:
        vocab = tokens.fit_vocabulary(ds.x_train, cfg.vocab_size, cfg.min_count)
        return {"train": tokens.encode(ds.x_train, vocab, cfg.max_length),
                "test": tokens.encode(ds.x_test, vocab, cfg.max_length),
                "measure": tokens.bag_of_words(ds.x_train, vocab), "vocabulary": np.array(vocab, dtype=str)}

    arrays = cached(cache_path(ds, "tokens", params, cfg.cache_dir), make)
    return replace(wrap(ds, arrays["train"], arrays["test"], (cfg.max_length,), "tokens"),
                   measure_train=arrays["measure"])


register(EmbeddingKind("tokens", token_ids, "token ids of a vocabulary fitted on the training texts (for a "
                       "sequence model: model.kind bilstm)", ("text",), gives="tokens",
                       reads=("max_length", "vocab_size", "min_count")))
