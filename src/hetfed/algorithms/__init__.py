"""Federated algorithms: one module each, registered by name (see :mod:`hetfed.algorithms.registry`).

Nothing here lists them: ``registry.specs()`` finds every module of this package.
"""

from __future__ import annotations

from hetfed.algorithms.build import algorithm_for, build_algorithm
from hetfed.interface import Algorithm, weighted_average

__all__ = ["Algorithm", "algorithm_for", "build_algorithm", "weighted_average"]
