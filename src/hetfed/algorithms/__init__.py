"""Federated algorithms, by the name a config uses."""

from __future__ import annotations

from hetfed.algorithms.base import Algorithm, weighted_average
from hetfed.algorithms.fedavg import FedAvg, FedProx, Local
from hetfed.config import TrainConfig
from hetfed.models.base import Model

ALGORITHMS: dict[str, type[Algorithm]] = {"fedavg": FedAvg, "fedprox": FedProx, "local": Local}


def build_algorithm(name: str, model: Model, train: TrainConfig) -> Algorithm:
    return ALGORITHMS[name](model, train)


__all__ = ["ALGORITHMS", "Algorithm", "FedAvg", "FedProx", "Local", "build_algorithm", "weighted_average"]
