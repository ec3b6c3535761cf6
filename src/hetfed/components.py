"""``hetfed components``: every kind of component, and what each kind has registered.

A kind is a registry (:mod:`hetfed.registry`, :data:`~hetfed.registry.KINDS`); each component is one file that
registers itself and declares its parameters. Algorithms keep their fuller view in ``hetfed algorithms``.
"""

from __future__ import annotations

from typing import Any

from hetfed.registry import KINDS, registry_of


def components(kind: str | None = None, name: str | None = None) -> dict[str, dict[str, Any]]:
    """``{kind: {"key": the config key that names one, "params_key": where its parameters are written,
    "components": [...]}}`` for one kind or all of them (``name``: only that component of ``kind``)."""
    chosen = [kind] if kind is not None else sorted(KINDS)
    out = {}
    for k in chosen:
        registry = registry_of(k)  # an unknown kind: a ConfigError naming the kinds
        described = registry.describe()
        if name is not None:
            registry.get(name)  # an unknown name: a ConfigError naming the others
            described = [c for c in described if c["name"] == name]
        out[k] = {"key": registry.key, "params_key": registry.params_key, "components": described}
    return out
