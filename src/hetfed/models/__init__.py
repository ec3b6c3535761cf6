"""Models over a client axis; each declares its shared and local parameters."""

from __future__ import annotations

from hetfed.models.base import Model, Noise, Params, ParamSpec
from hetfed.models.bilstm import BiLSTM
from hetfed.models.cgau import CGAUNet
from hetfed.models.charlstm import CharLSTM
from hetfed.models.cnn import FedAvgCNN, LeNet
from hetfed.models.kinds import build_model
from hetfed.models.mlp import MLP, LogisticRegression

__all__ = ["BiLSTM", "CGAUNet", "CharLSTM", "FedAvgCNN", "MLP", "LeNet", "LogisticRegression", "Model", "Noise",
           "ParamSpec", "Params", "build_model"]
