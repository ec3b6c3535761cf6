"""One server pipeline for every algorithm whose server holds a model.

    screen (norm filter, as updates arrive: :class:`hetfed.engine.robust.Screen`)
      → combine (mean, median, trimmed mean, Krum, Multi-Krum: ``train.aggregator``)
      → DP noise (DP-FedAvg: ``privacy.*``)
      → server optimiser on the pseudo-gradient (``server.*``: sgd, avgm, adam, yogi, adagrad)

Each stage is configured once and serves every algorithm alike; an algorithm's
``aggregate`` calls :meth:`ServerPipeline.step` (through ``Algorithm.server_step``) and
then does its own server work (FedDF's distillation, SCAFFOLD's control variate …).
The optimiser's state is returned to be kept in the server state, so it is
checkpointed with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hetfed.engine.robust import DPNoise, combine
from hetfed.engine.types import Params, Upload
from hetfed.server.optimizers import ServerOptimizer

#: the key of the server optimiser's state in ``ServerState.extra``
OPTIMIZER_STATE = "server_optimizer"


@dataclass(frozen=True)
class ServerPipeline:
    """combine → DP noise → server optimiser, as configured for one method."""

    STATE: ClassVar[str] = OPTIMIZER_STATE

    aggregator: str = "mean"
    trim_fraction: float = 0.1
    byzantine_fraction: float = 0.1
    multi_krum_keep: int | None = None
    multi_krum_weighted: bool = False
    optimizer: ServerOptimizer = ServerOptimizer()

    def step(self, params: Params, upload: Upload, opt_state: dict, dp: DPNoise | None = None,
             scale: float = 1.0) -> tuple[Params, dict]:
        """The new global model from a round's (screened) updates, and the optimiser's new state.

        ``scale`` multiplies the pseudo-gradient (combined − params) before the optimiser steps on it
        (FedNova's τ_eff); 1 leaves the combined model as it is.
        """
        combined = combine(params, upload, self.aggregator, 1.0, self.trim_fraction, self.byzantine_fraction,
                           self.multi_krum_keep, dp, self.multi_krum_weighted)
        if scale != 1.0:
            combined = {k: v + scale * (combined[k] - v) for k, v in params.items()}
        return self.optimizer.update(params, combined, opt_state)


def pipeline_for(train, server) -> ServerPipeline:
    """The pipeline of a method: ``train.aggregator`` (and its options) and ``server.*``."""
    return ServerPipeline(train.aggregator, train.trim_fraction, train.byzantine_fraction, train.multi_krum_keep,
                          train.multi_krum_weighted,
                          ServerOptimizer.from_config(server))
