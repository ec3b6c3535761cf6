"""Federated algorithms, by the name a config uses."""

from __future__ import annotations

from hetfed.algorithms.base import Algorithm, weighted_average
from hetfed.algorithms.fedavg import FedAvg, FedProx, Local
from hetfed.algorithms.fsnet import FedFSNet
from hetfed.config import FSNetConfig, TrainConfig
from hetfed.models.base import Model

ALGORITHMS: dict[str, type[Algorithm]] = {"fedavg": FedAvg, "fedprox": FedProx, "local": Local}


def build_algorithm(name: str, model: Model, train: TrainConfig, fsnet: FSNetConfig | None = None, in_features: int | None = None) -> Algorithm:
    """The algorithm a method names (``fedmoe`` is a pipeline: see hetfed.algorithms.fedmoe)."""
    if name == "fsnet":
        if in_features is None:
            raise ValueError("fsnet needs in_features (the input size the hidden model decodes to)")
        return FedFSNet(model, train, fsnet or FSNetConfig(), in_features)
    return ALGORITHMS[name](model, train)


__all__ = ["ALGORITHMS", "Algorithm", "FedAvg", "FedFSNet", "FedProx", "Local", "build_algorithm", "weighted_average"]
