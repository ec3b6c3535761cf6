"""A user's plugin module, as ``plugins: [tests.plugin_model]`` names it: one model in one file, with a parameter of
its own (``model: {kind: plugin_wide, width: 32}``) — nothing else is edited."""

from __future__ import annotations

from pydantic import Field

from hetfed.models.kinds import ModelKind, register
from hetfed.models.mlp import MLP, flat_size
from hetfed.registry import ComponentParams


class WideParams(ComponentParams):
    width: int = Field(16, ge=1, description="the one hidden layer's width")


def build(shape, n_classes, vocab_size, width):
    return MLP(flat_size(shape), [width], n_classes, 0.0)


register(ModelKind("plugin_wide", build, "one hidden layer of `width` units (a test plugin)", Params=WideParams))
