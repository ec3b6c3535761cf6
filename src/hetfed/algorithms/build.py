"""Building the algorithm object of a configured method: the same on every executor (in-process or Flower)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

import hetfed.algorithms.registry as registry
from hetfed.config import Config, MethodConfig, PrivacyConfig, ServerConfig, TrainConfig
from hetfed.errors import ConfigError
from hetfed.interface import Algorithm, Context
from hetfed.interface import private as algo_private
from hetfed.models.base import Model
from hetfed.registry import registry_of
from hetfed.run_spec import RunSpec
from hetfed.server.pipeline import server_chain


def build_algorithm(name: str, model: Model, train: TrainConfig, params: Mapping[str, Any] | Any = None, *,
                    server: ServerConfig | None = None, seed: int = 0, in_features: int | None = None,
                    build: Callable[[int], Model] | None = None, where: str = "",
                    privacy: PrivacyConfig | None = None, records: PrivacyConfig | None = None) -> Algorithm:
    """The registered algorithm ``name`` around ``model`` with its ``params`` (a mapping or its params model).

    ``server`` and ``privacy`` make its server chain (:func:`hetfed.server.pipeline.server_chain`; DP-FedAvg's
    noised mean is the combine step when ``privacy.noise_multiplier`` is set); ``records`` (the privacy section, when
    ``privacy.record`` is on) makes every local step DP-SGD;
    ``in_features`` and ``build`` are what some algorithms are built with besides the
    model (see :class:`hetfed.interface.Context`); ``where`` (``methods.0``) prefixes the
    keys named in errors.
    """
    prefix = f"{where}." if where else ""
    spec = registry.get(name, f"{prefix}algorithm")
    context = Context(server_chain(server or ServerConfig(), privacy), seed, in_features, build, privacy, records)
    try:
        return spec.cls(model, train, spec.make_params(params, f"{prefix}params"), context)
    except ConfigError as err:  # an algorithm names its key as "methods.*.…": say which method
        raise ConfigError(str(err).replace(METHOD_KEY, prefix or "")) from None


#: how an algorithm's constructor names its method's keys in an error (build_algorithm puts the index in)
METHOD_KEY = "methods.*."


def resolve_run(algo: Algorithm, fed: Any, train: TrainConfig, seed: int, architecture: Any = None,
                where: str = "", server: bool = True) -> RunSpec:
    """The run of ``algo`` on the federation ``fed``, resolved once: the settings the loop, the executors and the
    server read (:class:`~hetfed.run_spec.RunSpec`). The algorithm learns here, once, what its server may know
    before round 1 (:meth:`~hetfed.interface.Algorithm.bind`: the federation's size, the seed, how many clients a
    round expects) and refuses what the federation cannot give it; ``where`` (``methods.0``) names the method in
    that refusal. ``server`` False: the clients' side only (a Flower node, whose algorithm serves no round)."""
    from hetfed.engine.sampling import clients_per_round

    per_round = clients_per_round(train, int((~np.asarray(fed.opted_out, dtype=bool)).sum()))
    try:
        if server:
            algo.bind(fed, seed, per_round)
    except ConfigError as err:
        raise ConfigError(str(err).replace(METHOD_KEY, f"{where}." if where else "")) from None
    context = algo.context
    chain = context.pipeline if context.pipeline is not None else server_chain(ServerConfig())
    return RunSpec(algo, train, seed, algo.schedule, chain, algo_private(algo), context.records,
                   int(fed.n_clients), per_round, architecture)


def run_for(config: Config, method: MethodConfig, fed: Any, server: bool = True) -> RunSpec:
    """The run of one configured method on the federation ``fed``: its algorithm built and resolved (``server``:
    see :func:`resolve_run`)."""
    i = config.methods.index(method)
    model = config.method_model(method)
    algo = algorithm_for(config, method, tuple(fed.input_shape), fed.n_classes)
    return resolve_run(algo, fed, config.method_train(method), config.seed,
                       (model.model_dump_json(), tuple(fed.input_shape), fed.n_classes, _vocab(config)), f"methods.{i}",
                       server)


def algorithm_for(config: Config, method: MethodConfig, input_shape: tuple[int, ...], n_classes: int) -> Algorithm:
    """The algorithm object of one configured method."""
    from hetfed.models import build_model

    model_cfg = config.method_model(method)
    vocab = _vocab(config)
    model = build_model(model_cfg, input_shape, n_classes, vocab)
    server = config.method_server(method)
    private = config.privacy.noise_multiplier is not None
    if private:
        _check_private(config, method, server)
    _check_secure(config, method, server)
    algo = build_algorithm(method.algorithm, model, config.method_train(method), method.params,
                           server=server, seed=config.seed, in_features=int(np.prod(input_shape)),
                           build=lambda n_out: build_model(model_cfg, input_shape, n_out, vocab),
                           where=f"methods.{config.methods.index(method)}",
                           privacy=config.privacy if private else None,
                           records=config.privacy if config.privacy.record.noise_multiplier is not None else None)
    return algo


def _vocab(config: Config) -> int | None:
    """The token ids' range when the extractor gives tokens (its Params has vocab_size), else None."""
    gives_tokens = registry_of("embedding").get(config.embed.kind).gives == "tokens"
    return config.embed.params.vocab_size if gives_tokens else None


def _check_private(config: Config, method: MethodConfig, server: ServerConfig) -> None:
    """DP is refused, before any training, where its guarantee would not hold."""
    from hetfed.engine.privacy import check_available

    where = (
        f"privacy.noise_multiplier = {config.privacy.noise_multiplier:g} with methods.{config.methods.index(method)}"
    )
    if not registry.get(method.algorithm).capabilities.private:
        allowed = registry.with_capability(lambda c: c.private)
        raise ConfigError(f"{where}.algorithm = {method.algorithm!r} is not allowed: it uploads statistics "
                          f"(or nothing) that DP-FedAvg does not privatise; expected one of {allowed}")
    rule, plain = server.combine.rule, ServerConfig().combine.rule  # DP's noised mean replaces the rule
    if rule != plain:
        raise ConfigError(f"{where}.server.combine.rule = {rule!r} is not allowed: the noise is "
                          f"calibrated to the clipped mean; expected {plain!r}")
    check_available()


def _check_secure(config: Config, method: MethodConfig, server: ServerConfig) -> None:
    """Secure aggregation (``flower.secure_aggregation``) is refused, before any training, for a method whose server
    would need more than the weighted mean of the updates SecAgg+ reveals: individual updates (a robust rule, the norm
    filter, DP-FedAvg's per-update clipping), statistics besides the model, or an encoding that does not sum."""
    from hetfed.registry import registry_of

    if config.flower.secure_aggregation == "none" or registry_of("executor").get(config.train.executor).in_process:
        return  # in-process executors do not read the flower section (noted: config.unread_keys)
    i = config.methods.index(method)
    where = f"flower.secure_aggregation = {config.flower.secure_aggregation!r} with methods.{i}"
    if not registry.get(method.algorithm).capabilities.private:
        allowed = registry.with_capability(lambda c: c.private)
        raise ConfigError(f"{where}.algorithm = {method.algorithm!r} is not allowed: its server needs more than the "
                          f"weighted mean of the clients' parameters; expected one of {allowed}")
    plain = ServerConfig()
    if server.combine.rule != plain.combine.rule:
        raise ConfigError(f"{where}.server.combine.rule = {server.combine.rule!r} is not allowed: a robust rule "
                          f"needs every update and the server sees only their sum; expected {plain.combine.rule!r}")
    if server.screen.norm_factor != plain.screen.norm_factor:
        raise ConfigError(f"{where}.server.screen.norm_factor = {server.screen.norm_factor!r} is not allowed: the "
                          "norm filter compares individual updates, which the server does not see (each node screens "
                          f"its own cohort); expected the default {plain.screen.norm_factor!r}")
    if server.compression != plain.compression:
        raise ConfigError(f"{where}.server.compression = {server.compression.shown()} is not allowed: SecAgg+ "
                          f"quantises the updates itself and encodings do not sum; expected the default "
                          f"{plain.compression.shown()}")
    if config.privacy.noise_multiplier is not None:
        raise ConfigError(f"{where} and privacy.noise_multiplier = {config.privacy.noise_multiplier:g} is not "
                          "allowed: DP-FedAvg clips each update on the server, which sees only their sum; expected "
                          "privacy.noise_multiplier: null")
