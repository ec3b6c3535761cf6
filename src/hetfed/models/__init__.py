"""Models over a client axis; each declares its shared and local parameters."""

from __future__ import annotations

from collections.abc import Sequence

from hetfed.config import ModelConfig
from hetfed.errors import ConfigError
from hetfed.models.base import Model, Noise, Params, ParamSpec
from hetfed.models.bilstm import BiLSTM
from hetfed.models.cgau import CGAUNet
from hetfed.models.charlstm import CharLSTM
from hetfed.models.cnn import FedAvgCNN, LeNet
from hetfed.models.mlp import MLP, LogisticRegression, flat_size


def build_model(cfg: ModelConfig, input_shape: Sequence[int], n_classes: int, vocab_size: int | None = None) -> Model:
    """The model a config names, sized for the data (``vocab_size``: the token ids' range, for the BiLSTM)."""
    d = flat_size(input_shape)
    if cfg.kind == "bilstm":
        if vocab_size is None or len(input_shape) != 1:
            raise ConfigError(f"model.kind = 'bilstm' is not allowed for inputs of shape {tuple(input_shape)}: "
                              "expected token ids (embed.kind = 'tokens')")
        return BiLSTM(int(input_shape[0]), vocab_size, n_classes, cfg.embedding_dim, cfg.lstm_hidden, cfg.dropout)
    if cfg.kind == "charlstm":
        from hetfed.data.shakespeare import ALL_LETTERS

        if len(input_shape) != 1:
            raise ConfigError(f"model.kind = 'charlstm' is not allowed for inputs of shape {tuple(input_shape)}: "
                              "expected character windows (dataset.name = 'shakespeare')")
        return CharLSTM(int(input_shape[0]), len(ALL_LETTERS), n_classes, cfg.embedding_dim, cfg.lstm_hidden,
                        cfg.lstm_layers, cfg.dropout)
    if cfg.kind == "mlp":
        return MLP(d, cfg.hidden, n_classes, cfg.dropout)
    if cfg.kind == "logreg":
        return LogisticRegression(d, n_classes)
    if cfg.kind == "cnn":
        return LeNet(input_shape, n_classes)
    if cfg.kind == "cnn4":
        return FedAvgCNN(input_shape, n_classes, cfg.batch_norm)
    if cfg.kind == "cgau":
        return CGAUNet(d, cfg.hidden, n_classes, cfg.dropout, cfg.condition_output)
    raise ValueError(f"unknown model.kind {cfg.kind!r}")


__all__ = ["BiLSTM", "CGAUNet", "CharLSTM", "FedAvgCNN", "MLP", "LeNet", "LogisticRegression", "Model", "Noise", "ParamSpec", "Params", "build_model"]
