"""Federated algorithms: one module each, registered by name (see :mod:`hetfed.algorithms.registry`).

Nothing here lists them: ``registry.specs()`` finds every module of this package.
"""

from __future__ import annotations

from hetfed.algorithms.build import algorithm_for, build_algorithm, resolve_run, run_for
from hetfed.engine.types import Params, Upload
from hetfed.interface import Algorithm
from hetfed.server.combine.mean import weighted_mean


def weighted_average(old: Params, upload: Upload, server_lr: float = 1.0) -> Params:
    """``old + η·(Σ_k w_k θ_k − old)`` with ``w_k ∝`` the clients' sample counts.

    A :class:`~hetfed.engine.types.StreamedUpload` (many chunks, reduced as they came) carries the mean already.
    """
    avg = weighted_mean(old, upload)
    return {k: avg[k] if server_lr == 1.0 else v + server_lr * (avg[k] - v) for k, v in old.items()}


__all__ = ["Algorithm", "algorithm_for", "build_algorithm", "resolve_run", "run_for", "weighted_average"]
