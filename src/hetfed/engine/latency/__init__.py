"""Latency models of the simulated clock (``train.clock: {latency, …its own keys}``, :mod:`hetfed.engine.clock`).

Each is one module of this package registering a :class:`LatencyModel` with its own parameters (``Params``):
``multipliers(params, n, rng)`` draws each client's speed as a multiple of the median (median 1), once per run;
``reads_file``: the speeds come from the CSV its ``file`` names instead; ``wall``: no model — an asynchronous
server on Flower merges replies in the order they really come (the clock then draws as ``constant``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field

from hetfed.registry import ComponentParams, Registry


@dataclass(frozen=True)
class LatencyModel:
    name: str
    summary: str
    Params: type[ComponentParams] = ComponentParams
    multipliers: Callable[[Any, int, np.random.Generator], np.ndarray] = lambda p, n, rng: np.ones(n)
    reads_file: bool = False
    wall: bool = False


class SpreadParams(ComponentParams):
    spread: float = Field(1.0, gt=0, description="how far the speeds spread around the median")


LATENCY: Registry[LatencyModel] = Registry("latency", __name__, "train.clock.latency",
                                           noun="latency model")


def register(model: LatencyModel) -> LatencyModel:
    return LATENCY.register(model.name, model)
