"""``charlstm``: McMahan et al.'s character LSTM over Shakespeare's 80-character windows —
:class:`~hetfed.models.charlstm.CharLSTM`."""

from __future__ import annotations

from hetfed.errors import ConfigError
from hetfed.models.charlstm import CharLSTM
from hetfed.models.kinds import ModelKind, register


def build(shape, n_classes, vocab_size, embedding_dim, lstm_hidden, lstm_layers, dropout):
    from hetfed.data.shakespeare import ALL_LETTERS

    if len(shape) != 1:
        raise ConfigError(f"model.kind = 'charlstm' is not allowed for inputs of shape {tuple(shape)}: "
                          "expected character windows (dataset.name = 'shakespeare')")
    return CharLSTM(int(shape[0]), len(ALL_LETTERS), n_classes, embedding_dim, lstm_hidden, lstm_layers, dropout)


register(ModelKind("charlstm", build, "a stacked character LSTM predicting the next character", inputs="characters",
                   reads=("embedding_dim", "lstm_hidden", "lstm_layers", "dropout")))
