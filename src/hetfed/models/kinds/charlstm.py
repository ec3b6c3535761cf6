"""``charlstm``: McMahan et al.'s character LSTM over Shakespeare's 80-character windows —
:class:`~hetfed.models.charlstm.CharLSTM`."""

from __future__ import annotations

from pydantic import Field

from hetfed.errors import ConfigError
from hetfed.models.charlstm import CharLSTM
from hetfed.models.kinds import ModelKind, register
from hetfed.registry import ComponentParams


class CharLSTMParams(ComponentParams):
    embedding_dim: int = Field(100, ge=1, description="the character embedding's width (McMahan et al.: 8)")
    lstm_hidden: int = Field(64, ge=1, description="each layer's width (McMahan et al.: 256)")
    lstm_layers: int = Field(2, ge=1, le=4, description="stacked LSTM layers (McMahan et al.: 2)")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout between the layers")


def build(shape, n_classes, vocab_size, embedding_dim, lstm_hidden, lstm_layers, dropout):
    from hetfed.data.shakespeare import ALL_LETTERS

    if len(shape) != 1:
        raise ConfigError(f"model.kind = 'charlstm' is not allowed for inputs of shape {tuple(shape)}: "
                          "expected character windows (dataset.name = 'shakespeare')")
    return CharLSTM(int(shape[0]), len(ALL_LETTERS), n_classes, embedding_dim, lstm_hidden, lstm_layers, dropout)


register(ModelKind("charlstm", build, "a stacked character LSTM predicting the next character", inputs="characters",
                   Params=CharLSTMParams))
