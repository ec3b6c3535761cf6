"""Data on the server (``server_data.*``): held out of the training pool, or another dataset.

FedDF distils the clients' ensemble into the global model on it, unlabeled. Which methods need
it is their registered capability (``server_data``); this module only takes it from the data. Labels are
dropped here, so no method can use them — except a holdout's, kept when a method's combine rule trains on a
labelled root set (its registered ``root``: FLTrust's server update), which only that rule reads.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from hetfed.config import Config
from hetfed.errors import ConfigError


def wanted(config: Config) -> str:
    """``none``, ``holdout`` or ``dataset``: what this run's server holds (``auto`` resolved: a holdout when a
    method needs server data or its combine rule a root set)."""
    source = config.server_data.source
    if source == "auto":
        from hetfed.registry import registry_of

        registry = registry_of("algorithm")  # which methods need server data is a capability
        needs = any(registry.get(m.algorithm).capabilities.server_data for m in config.methods)
        return "holdout" if needs or labelled(config) else "none"
    return source


def labelled(config: Config) -> bool:
    """Whether the server keeps its holdout's labels: a method's combine rule trains on a labelled root set."""
    from hetfed.registry import registry_of

    rules = registry_of("combine")
    return any(rules.get(config.method_server(m).combine.rule).root for m in config.methods)


def split_off(data, config: Config):
    """``(data for the clients, server inputs or None, their labels or None)``: a holdout is cut before
    partitioning; its labels are kept only where a combine rule trains on them (:func:`labelled`)."""
    source, cfg = wanted(config), config.server_data
    if source == "none":
        return data, None, None
    labels = None
    rng = np.random.default_rng([config.seed, 0x5E12])
    if source == "holdout":
        n = len(data.y_train)
        held = rng.permutation(n)[: max(1, int(round(cfg.fraction * n)))]
        keep = np.setdiff1d(np.arange(n), held)
        client_train = data.client_train[keep] if data.client_train is not None else None
        bag = getattr(data, "measure_train", None)
        rest = replace(data, x_train=data.x_train[keep], y_train=data.y_train[keep], client_train=client_train,
                       **({"measure_train": bag[keep]} if bag is not None else {}))
        server = data.x_train[np.sort(held)]
        labels = np.asarray(data.y_train)[np.sort(held)] if labelled(config) else None
    else:
        rest, server = data, _other_dataset(data, config)
    if cfg.max_samples is not None and len(server) > cfg.max_samples:
        kept = np.sort(rng.choice(len(server), cfg.max_samples, replace=False))
        server, labels = server[kept], (labels[kept] if labels is not None else None)
    return rest, np.ascontiguousarray(server, dtype=np.float32), labels


def _other_dataset(data, config: Config) -> np.ndarray:
    from hetfed.config import DatasetConfig
    from hetfed.data import embed, load_dataset

    cfg = config.server_data
    other = embed(load_dataset(DatasetConfig(name=cfg.name, data_dir=cfg.data_dir)), config.embed, progress=False)
    if other.x_train.shape[1:] != data.x_train.shape[1:]:
        raise ConfigError(f"server_data.name = {cfg.name!r} is not allowed here: its inputs have "
                          f"{other.x_train.shape[1:]} features, the federation's {data.x_train.shape[1:]}; expected a "
                          "dataset of the same input shape (e.g. fashion-mnist for mnist)")
    return other.x_train
