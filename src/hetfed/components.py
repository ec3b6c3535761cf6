"""``hetfed components``: every kind of component that has a registry, and what each has registered.

A kind is a registry (:mod:`hetfed.registry`); each component is one file that registers itself and
declares its parameters. Algorithms keep their fuller view in ``hetfed algorithms``; a partitioner's keys are
``partition.*`` (the schema says which kind reads which). The kinds that are not registries yet (datasets,
models, embeddings, executors) are chosen by name lists in the config schema; #46 turns them into registries
one by one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _algorithms() -> list[dict[str, Any]]:
    from hetfed.algorithms import registry

    return [spec.describe() for spec in registry.specs()]


def _combine() -> list[dict[str, Any]]:
    from hetfed.server.combine import describe

    return describe()


def _partitioners() -> list[dict[str, Any]]:
    from hetfed.partition import PARTITIONERS

    return [{"name": name, "summary": " ".join((p.split.__doc__ or "").split()), "ordered": p.ordered}
            for name, p in PARTITIONERS.items()]


def _optimizers() -> list[dict[str, Any]]:
    from hetfed.server.optimizers import describe

    return describe()


#: kind → (the config key that names one, its listing)
KINDS: dict[str, tuple[str, Callable[[], list[dict[str, Any]]]]] = {
    "algorithm": ("methods[i].algorithm", _algorithms),
    "partitioner": ("partition.kind", _partitioners),
    "combine": ("server.combine.rule", _combine),
    "optimizer": ("server.optimizer", _optimizers),
}


def components(kind: str | None = None) -> dict[str, dict[str, Any]]:
    """``{kind: {"key": config key, "components": [...]}}`` for one kind or all of them."""
    from hetfed.errors import ConfigError

    if kind is not None and kind not in KINDS:
        raise ConfigError(f"components kind {kind!r} is not allowed: expected one of {sorted(KINDS)}")
    return {k: {"key": key, "components": listing()} for k, (key, listing) in KINDS.items() if kind in (None, k)}
