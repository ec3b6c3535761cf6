"""Models over a client axis; each declares its shared and local parameters."""

from __future__ import annotations

from collections.abc import Sequence

from hetfed.config import ModelConfig
from hetfed.models.base import Model, Noise, Params, ParamSpec
from hetfed.models.cgau import CGAUNet
from hetfed.models.cnn import LeNet
from hetfed.models.mlp import MLP, LogisticRegression, flat_size


def build_model(cfg: ModelConfig, input_shape: Sequence[int], n_classes: int) -> Model:
    """The model a config names, sized for the data."""
    d = flat_size(input_shape)
    if cfg.kind == "mlp":
        return MLP(d, cfg.hidden, n_classes, cfg.dropout)
    if cfg.kind == "logreg":
        return LogisticRegression(d, n_classes)
    if cfg.kind == "cnn":
        return LeNet(input_shape, n_classes)
    if cfg.kind == "cgau":
        return CGAUNet(d, cfg.hidden, n_classes, cfg.dropout, cfg.condition_output)
    raise ValueError(f"unknown model.kind {cfg.kind!r}")


__all__ = ["CGAUNet", "MLP", "LeNet", "LogisticRegression", "Model", "Noise", "ParamSpec", "Params", "build_model"]
