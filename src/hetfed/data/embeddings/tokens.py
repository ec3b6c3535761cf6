"""``tokens``: token ids from a vocabulary fitted on the training texts — the inputs of ``model.kind: bilstm``."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from pydantic import Field

from hetfed.config import EmbedConfig
from hetfed.data.embed import Embedded, cache_path, cached, wrap
from hetfed.data.embeddings import EmbeddingKind, register
from hetfed.data.loading import Dataset
from hetfed.registry import ComponentParams


class TokensParams(ComponentParams):
    """A component that gives tokens declares ``vocab_size``: the token models are sized by it."""

    max_length: int = Field(64, ge=1, description="every text padded or truncated to this many tokens")
    vocab_size: int = Field(10_000, ge=3, description="the vocabulary's size, padding and unknown included")
    min_count: int = Field(1, ge=1, description="a word needs this many training occurrences to get an id")


def token_ids(ds: Dataset, cfg: EmbedConfig, progress: bool) -> Embedded:
    """Token ids from a vocabulary fitted on the training texts, cached like an extractor's output."""
    from hetfed.data import tokens

    p: TokensParams = cfg.params
    params = {"max_length": p.max_length, "vocab_size": p.vocab_size, "min_count": p.min_count,
              "words": f"sklearn-lower-{tokens.WORD_PATTERN}", "lsa": tokens.LSA_COMPONENTS}

    def make() -> dict[str, np.ndarray]:
        vocab = tokens.fit_vocabulary(ds.x_train, p.vocab_size, p.min_count)
        return {"train": tokens.encode(ds.x_train, vocab, p.max_length),
                "test": tokens.encode(ds.x_test, vocab, p.max_length),
                "measure": tokens.bag_of_words(ds.x_train, vocab), "vocabulary": np.array(vocab, dtype=str)}

    arrays = cached(cache_path(ds, "tokens", params, cfg.cache_dir), make)
    return replace(wrap(ds, arrays["train"], arrays["test"], (p.max_length,), "tokens"),
                   measure_train=arrays["measure"])


register(EmbeddingKind("tokens", token_ids, "token ids of a vocabulary fitted on the training texts (for a "
                       "sequence model: model.kind bilstm)", ("text",), gives="tokens",
                       Params=TokensParams, fitted=True))
