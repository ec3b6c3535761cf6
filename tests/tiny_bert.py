"""A BERT of 2 layers and width 16 with its WordPiece tokenizer, written as a Hugging Face folder: the pretrained
encoder the LoRA tests and the LoRA benchmark's smoke test load (nothing downloads)."""

from __future__ import annotations

from pathlib import Path

import torch

WORDS = ["the", "a", "cat", "dog", "sat", "ran", "on", "mat", "log", "big", "small", "red", "blue", "fast", "slow",
         "happy", "sad", "good", "bad", "film", "movie", "plot", "actor", "scene"]


def write_tiny_bert(folder: Path) -> Path:
    """The encoder's weights (seed 0) and tokenizer in ``folder``; returns it."""
    import transformers

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    transformers.BertTokenizerFast(vocab={w: i for i, w in enumerate(vocab)}).save_pretrained(folder)
    config = transformers.BertConfig(vocab_size=len(vocab), hidden_size=16, num_hidden_layers=2,
                                     num_attention_heads=2, intermediate_size=32, max_position_embeddings=32)
    torch.manual_seed(0)
    transformers.BertModel(config).save_pretrained(folder)
    return folder
