"""The model registry: what ``model.kind`` names — one module of this package per kind of network.

A model module registers a :class:`ModelKind`: ``build(input_shape, n_classes, vocab_size, **params)`` (the
network over a client axis, :mod:`hetfed.models.base`), its own parameters (``Params``: the keys beside
``model.kind``, passed to ``build``, with the checks of their own; another kind's keys are refused) and what inputs
it reads (``"features"``: vectors or images; ``"tokens"``: token ids; ``"characters"``: character windows).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import Field, model_validator

from hetfed.config import ModelConfig
from hetfed.models.base import Model
from hetfed.registry import ComponentParams, Registry, describe_params, registry_of


@dataclass(frozen=True)
class ModelKind:
    name: str
    build: Callable[..., Model]
    summary: str
    Params: type[ComponentParams] = ComponentParams
    inputs: str = "features"


class WidthsParams(ComponentParams):
    """The parameters of a network of fully connected hidden layers (mlp, cgau)."""

    hidden: list[int] = Field(default_factory=lambda: [64, 64], description="the hidden layers' widths")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout after every hidden layer")

    @model_validator(mode="after")
    def _positive_widths(self) -> WidthsParams:
        if any(h < 1 for h in self.hidden):
            raise ValueError(f"model.hidden = {self.hidden}: every width must be ≥ 1")
        return self


def _described(kind: ModelKind) -> dict[str, Any]:
    return {"summary": kind.summary, "inputs": kind.inputs, "params": describe_params(kind.Params)}


#: every model, by ``model.kind`` (one module of this package each)
MODELS: Registry[ModelKind] = Registry("model", __name__, "model.kind", describe=_described)


def register(kind: ModelKind) -> ModelKind:
    return MODELS.register(kind.name, kind)


def build_model(cfg: ModelConfig, input_shape: Sequence[int], n_classes: int, vocab_size: int | None = None) -> Model:
    """The model a config names, sized for the data (``vocab_size``: the token ids' range, for token models),
    built from its kind's own parameters."""
    kind = registry_of("model").get(cfg.kind, "model.kind")
    return kind.build(tuple(input_shape), n_classes, vocab_size, **dict(cfg.params))
