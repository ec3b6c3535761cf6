"""FedNova (Wang, Liu, Liang, Joshi, Poor 2020, "Tackling the Objective Inconsistency Problem in
Heterogeneous Federated Optimization", eqs. 5–7).

Clients that take different numbers of local steps τ_i pull FedAvg towards the objectives of those
that take more. FedNova averages *normalised* updates instead:

    d_i = (x − y_i) / (η·‖a_i‖₁)                 (client i's normalised update)
    x ← x − τ_eff·η·Σ_i p_i·d_i,   τ_eff = Σ_i p_i·‖a_i‖₁,  p_i = n_i / Σ_{j∈round} n_j

where y_i is the client's model after its local steps and ‖a_i‖₁ how many plain-SGD steps they
amount to: τ_i for plain SGD, [τ_i − ρ(1 − ρ^τ_i)/(1 − ρ)]/(1 − ρ) for heavy-ball momentum ρ reset
each round (the paper's §5; :func:`hetfed.algorithms.scaffold.effective_steps`). η cancels.

So each client uploads z_i = x − (x − y_i)/‖a_i‖₁ in place of its model, and ‖a_i‖₁
(``Upload.extra["steps"]``); the server pipeline averages the z_i (p_i-weighted, streamed
like any model) and moves x by τ_eff·(z̄ − x) — the pseudo-gradient the server optimiser
(``server.*``) then steps on. With equal τ_i it is FedAvg exactly.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from hetfed.algorithms.fedavg import FedAvg
from hetfed.algorithms.registry import AlgorithmSpec, Capabilities, PrivacyRow, register
from hetfed.algorithms.scaffold import effective_steps
from hetfed.engine.types import Broadcast, ClientData, ClientState, ServerState, Upload
from hetfed.interface import server_step


class FedNova(FedAvg):
    """FedAvg with normalised averaging (see the module docstring)."""

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        upload, new_states = super().local_update(bc, states, data)
        device = upload.num_samples.device
        steps = torch.tensor([effective_steps(self.schedule.n_steps(len(i)), self.train.optimizer)
                              for i in data.indices], dtype=torch.float32, device=device).clamp(min=1e-12)
        normalised = {}
        received = bc.stacked(len(data.client_ids))  # each client's own global model (a stacked sweep: its run's)
        for k, y in upload.params.items():
            x = received[k]
            normalised[k] = x - (x - y) / steps.view(-1, *([1] * (y.dim() - 1)))
        return replace(upload, params=normalised, extra={**upload.extra, "steps": steps}), new_states

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        if not upload.client_ids:
            return ServerState(state.params, state.round + 1, state.extra)
        counts = upload.num_samples.double()
        tau_eff = float((counts * upload.extra["steps"].double().cpu().to(counts.device)).sum() / counts.sum())
        params, extra = server_step(self, state, upload, scale=tau_eff)
        return ServerState(params, state.round + 1, extra)


register(AlgorithmSpec(
    "fednova", FedNova, "FedAvg that averages updates normalised by each client's number of local steps, so "
    "clients that train longer do not pull the model to their own objective",
    "Wang et al. 2020, Tackling the Objective Inconsistency Problem in Heterogeneous Federated Optimization",
    capabilities=Capabilities(uploads="normalised shared parameters, sample count, training loss, the number of "
                              "local steps ‖a_i‖₁", stacks_runs=True),
    privacy=(
        PrivacyRow(
            method="FedNova",
            config="`algorithm: fednova`",
            params="its normalised model z_i = x − (x − y_i)/‖a_i‖₁ (same names and shapes as the shared parameters)",
            extra="`train_loss`; `steps`: ‖a_i‖₁, how many plain-SGD steps its local work amounts to (one number)",
            stays="data; optimiser state when kept",
        ),
    ),
    family="heterogeneity-specific", venue="NeurIPS 2020",
))
