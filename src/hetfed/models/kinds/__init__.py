"""The model registry: what ``model.kind`` names — one module of this package per kind of network.

A model module registers a :class:`ModelKind`: ``build(input_shape, n_classes, vocab_size, **params)`` (the
network over a client axis, :mod:`hetfed.models.base`), the ``model.*`` keys it reads (its parameters: only those
are passed to ``build``; a value set for a key it does not read is noted as unread), what inputs it reads
(``"features"``: vectors or images; ``"tokens"``: token ids; ``"characters"``: character windows) and an optional
``check(params)`` of its own (a message when they cannot make this network).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hetfed.config import ModelConfig
from hetfed.models.base import Model
from hetfed.registry import Registry, registry_of


@dataclass(frozen=True)
class ModelKind:
    name: str
    build: Callable[..., Model]
    summary: str
    reads: tuple[str, ...] = ()
    inputs: str = "features"
    check: Callable[[dict[str, Any]], str | None] | None = None


def _described(kind: ModelKind) -> dict[str, Any]:
    from hetfed.registry import describe_params

    params = [p for p in describe_params(ModelConfig) if p["name"] in kind.reads]
    return {"summary": kind.summary, "inputs": kind.inputs, "params": params}


#: every model, by ``model.kind`` (one module of this package each)
MODELS: Registry[ModelKind] = Registry("model", __name__, "model.kind", describe=_described)


def register(kind: ModelKind) -> ModelKind:
    return MODELS.register(kind.name, kind)


def build_model(cfg: ModelConfig, input_shape: Sequence[int], n_classes: int, vocab_size: int | None = None) -> Model:
    """The model a config names, sized for the data (``vocab_size``: the token ids' range, for token models),
    built from the parameters its kind reads."""
    kind = registry_of("model").get(cfg.kind, "model.kind")
    return kind.build(tuple(input_shape), n_classes, vocab_size, **{k: getattr(cfg, k) for k in kind.reads})
