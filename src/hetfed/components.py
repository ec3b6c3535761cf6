"""``hetfed components``: every kind of component that has a registry, and what each has registered.

A kind is a registry (:mod:`hetfed.registry`); each component is one file that registers itself and
declares its parameters. Algorithms keep their fuller view in ``hetfed algorithms``. The kinds that are
not registries yet (datasets, partitioners, models, embeddings, executors) are chosen by name lists in the
config schema; issue #46 turns them into registries one by one.
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


def _optimizers() -> list[dict[str, Any]]:
    from hetfed.server.optimizers import describe

    return describe()


#: kind → (the config key that names one, its listing)
KINDS: dict[str, tuple[str, Callable[[], list[dict[str, Any]]]]] = {
    "algorithm": ("methods[i].algorithm", _algorithms),
    "combine": ("server.combine.rule", _combine),
    "optimizer": ("server.optimizer", _optimizers),
}


def components(kind: str | None = None) -> dict[str, dict[str, Any]]:
    """``{kind: {"key": config key, "components": [...]}}`` for one kind or all of them."""
    from hetfed.errors import ConfigError

    if kind is not None and kind not in KINDS:
        raise ConfigError(f"components kind {kind!r} is not allowed: expected one of {sorted(KINDS)}")
    return {k: {"key": key, "components": listing()} for k, (key, listing) in KINDS.items() if kind in (None, k)}
