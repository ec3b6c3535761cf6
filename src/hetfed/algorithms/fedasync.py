"""FedAsync (Xie et al. 2019, "Asynchronous Federated Optimization", Algorithm 1).

``concurrency`` clients train at once; every arrival is merged at once: the server mixes the client's model
θ_new into its own, θ ← (1 − α_t)θ + α_t·θ_new with α_t = α·s(t − τ), where t − τ is how many updates the server
made since the model the client trained from and s the staleness function (constant, polynomial, hinge: §5.2).
With ``rho`` > 0 clients train the paper's regularised objective f(x) + ρ/2‖x − x_τ‖² (by its closed-form
gradient, as FedProx's term).

Here the mix is the method's server chain: the combine step takes the arrival's model, the rescale step
x + α_t(θ_new − x), and the optimiser (``server.optimizer.lr`` 1: nothing more).
"""

from __future__ import annotations

import numpy as np
from pydantic import Field

from hetfed.algorithms._async import Asynchronous, AsyncParams, staleness_weight
from hetfed.algorithms.registry import AlgorithmSpec, Capabilities, PrivacyRow, register
from hetfed.engine.local import Proximal
from hetfed.engine.types import Broadcast, ClientData, Params, ServerState, Upload
from hetfed.interface import server_step


class FedAsyncParams(AsyncParams):
    alpha: float = Field(0.6, gt=0, le=1, description="α, the mixing weight of a fresh arrival (the paper: 0.6–0.9)")
    rho: float = Field(0.0, ge=0, description="ρ, the clients' proximal weight ρ/2‖x − x_τ‖² (0: plain local SGD)")


class FedAsync(Asynchronous):
    params: FedAsyncParams

    def _regulariser(self, bc: Broadcast, data: ClientData):
        return Proximal(bc.params, self.params.rho) if self.params.rho > 0 else None

    def merge(self, state: ServerState, arrivals: Upload, starts: Params, staleness: np.ndarray) -> ServerState:
        for j in range(len(arrivals.client_ids)):  # one by one, in arrival order (the buffer holds one)
            alpha = float(self.params.alpha * staleness_weight(staleness[j : j + 1], self.params)[0])
            row = Upload([arrivals.client_ids[j]], {k: v[j : j + 1] for k, v in arrivals.params.items()},
                         arrivals.num_samples[j : j + 1], {k: v[j : j + 1] for k, v in arrivals.extra.items()})
            params, extra = server_step(self, state, row, scale=alpha)
            state = ServerState(params=params, round=state.round + 1, extra=extra)
        return state


register(AlgorithmSpec(
    "fedasync", FedAsync, "asynchronous: every arrival is mixed into the server's model with weight α·s(staleness)",
    "Xie et al. 2019, Asynchronous Federated Optimization", FedAsyncParams,
    Capabilities(whole_round=True, asynchronous=True, stacks_runs=True), quick={"concurrency": 3},
    privacy=(
        PrivacyRow(
            method="FedAsync",
            config="`algorithm: fedasync`",
            params="shared model parameters",
            extra="`train_loss`",
            stays="data; optimiser state when kept",
        ),
    ),
    family="global", venue="OPT workshop 2020",
))
