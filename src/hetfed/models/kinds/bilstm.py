"""``bilstm``: a bidirectional LSTM over token ids (``embed.kind: tokens``) — :class:`~hetfed.models.bilstm.BiLSTM`."""

from __future__ import annotations

from pydantic import Field

from hetfed.errors import ConfigError
from hetfed.models.bilstm import BiLSTM
from hetfed.models.kinds import ModelKind, register
from hetfed.registry import ComponentParams


class BiLSTMParams(ComponentParams):
    embedding_dim: int = Field(100, ge=1, description="the token embedding's width")
    lstm_hidden: int = Field(64, ge=1, description="the LSTM's width in each direction")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the pooled features")


def build(shape, n_classes, vocab_size, embedding_dim, lstm_hidden, dropout):
    if vocab_size is None or len(shape) != 1:
        raise ConfigError(f"model.kind = 'bilstm' is not allowed for inputs of shape {tuple(shape)}: "
                          "expected token ids (embed.kind = 'tokens')")
    return BiLSTM(int(shape[0]), vocab_size, n_classes, embedding_dim, lstm_hidden, dropout)


register(ModelKind("bilstm", build, "a bidirectional LSTM over token ids", inputs="tokens",
                   Params=BiLSTMParams))
