"""Federated algorithms, by the name a config uses."""

from __future__ import annotations

from collections.abc import Callable

from hetfed.algorithms.afl import Afl
from hetfed.algorithms.fedavg import FedAvg, FedProx, Local
from hetfed.algorithms.feddf import FedDF
from hetfed.algorithms.fedgen import FedGen
from hetfed.algorithms.fedmoe import FedMoE
from hetfed.algorithms.fsnet import FedFSNet
from hetfed.algorithms.scaffold import Scaffold
from hetfed.config import (
    AFLConfig,
    Config,
    FedDFConfig,
    FedGenConfig,
    FSNetConfig,
    MethodConfig,
    MoEConfig,
    TrainConfig,
)
from hetfed.interface import Algorithm, weighted_average
from hetfed.models.base import Model

ALGORITHMS: dict[str, type[Algorithm]] = {"fedavg": FedAvg, "fedprox": FedProx, "local": Local, "scaffold": Scaffold}


def build_algorithm(
    name: str,
    model: Model,
    train: TrainConfig,
    fsnet: FSNetConfig | None = None,
    in_features: int | None = None,
    moe: MoEConfig | None = None,
    build: Callable[[int], Model] | None = None,
    seed: int = 0,
    afl: AFLConfig | None = None,
    feddf: FedDFConfig | None = None,
    fedgen: FedGenConfig | None = None,
) -> Algorithm:
    """The algorithm a method names, around its model.

    ``fsnet`` needs ``in_features`` (what its hidden model decodes to); ``fedmoe``
    needs ``build`` (a model of the same kind with n outputs, for its gate) and the
    run's ``seed`` (its per-client phases draw from it).
    """
    if name == "fsnet":
        if in_features is None:
            raise ValueError("fsnet needs in_features (the input size the hidden model decodes to)")
        return FedFSNet(model, train, fsnet or FSNetConfig(), in_features)
    if name == "fedmoe":
        if build is None:
            raise ValueError("fedmoe needs build (the model factory its gate is made with)")
        return FedMoE(model, train, moe or MoEConfig(), build, seed)
    if name == "afl":
        return Afl(model, train, afl)
    if name == "feddf":
        return FedDF(model, train, feddf)
    if name == "fedgen":
        return FedGen(model, train, fedgen)
    return ALGORITHMS[name](model, train)


def algorithm_for(config: Config, method: MethodConfig, input_shape: tuple[int, ...], n_classes: int) -> Algorithm:
    """The algorithm object of one configured method: the same on every executor (in-process or Flower)."""
    import numpy as np

    from hetfed.models import build_model

    model_cfg = config.method_model(method)
    vocab = config.embed.vocab_size if config.embed.kind == "tokens" else None
    model = build_model(model_cfg, input_shape, n_classes, vocab)
    algo = build_algorithm(
        method.algorithm, model, config.method_train(method), config.fsnet, int(np.prod(input_shape)),
        config.moe, lambda n_out: build_model(model_cfg, input_shape, n_out, vocab), config.seed, config.afl,
        config.feddf,
        config.fedgen,
    )
    if config.privacy.noise_multiplier is not None:
        _check_private(config, method, algo)
        algo.privacy = config.privacy
    return algo


#: what DP-FedAvg can privatise: algorithms whose uploads are only shared parameters (+ the training loss)
PRIVATE = ("fedavg", "fedprox", "fedmoe")


def _check_private(config: Config, method: MethodConfig, algo: Algorithm) -> None:
    """DP is refused, before any training, where its guarantee would not hold."""
    from hetfed.engine.privacy import check_available
    from hetfed.errors import ConfigError

    where = f"privacy.noise_multiplier = {config.privacy.noise_multiplier:g} with methods.{config.methods.index(method)}"
    if method.algorithm not in PRIVATE:
        raise ConfigError(f"{where}.algorithm = {method.algorithm!r} is not allowed: it uploads statistics "
                          f"(or nothing) that DP-FedAvg does not privatise; expected one of {list(PRIVATE)}")
    if algo.train.aggregator != "mean":
        raise ConfigError(f"{where}.train.aggregator = {algo.train.aggregator!r} is not allowed: the noise is "
                          "calibrated to the clipped mean; expected 'mean'")
    check_available()


__all__ = ["ALGORITHMS", "Afl", "Algorithm", "FedAvg", "FedDF", "FedGen", "FedFSNet", "FedMoE", "FedProx", "Local", "Scaffold", "algorithm_for",
           "build_algorithm", "weighted_average"]
