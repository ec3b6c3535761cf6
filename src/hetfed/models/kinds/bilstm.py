"""``bilstm``: a bidirectional LSTM over token ids (``embed.kind: tokens``) — :class:`~hetfed.models.bilstm.BiLSTM`."""

from __future__ import annotations

from hetfed.errors import ConfigError
from hetfed.models.bilstm import BiLSTM
from hetfed.models.kinds import ModelKind, register


def build(shape, n_classes, vocab_size, embedding_dim, lstm_hidden, dropout):
    if vocab_size is None or len(shape) != 1:
        raise ConfigError(f"model.kind = 'bilstm' is not allowed for inputs of shape {tuple(shape)}: "
                          "expected token ids (embed.kind = 'tokens')")
    return BiLSTM(int(shape[0]), vocab_size, n_classes, embedding_dim, lstm_hidden, dropout)


register(ModelKind("bilstm", build, "a bidirectional LSTM over token ids", inputs="tokens",
                   reads=("embedding_dim", "lstm_hidden", "dropout")))
