"""FFA-LoRA (Sun et al., "Improving LoRA in Privacy-preserving Federated Learning", ICLR 2024).

The adapters' A matrices are frozen at their random initialisation — the same draw on every client (the run seed's
server initialisation) — and only the B matrices (and here the classification head) are trained, uploaded and
averaged. With A fixed, the average of the clients' updates B_k A is the update of the averaged B, so aggregation is
exact, and half of the adapters' parameters never travel. The server's model is complete (the broadcast B and head
with the shared A), so it is scored on the global test set as FedAvg's is. The paper's other point, FFA-LoRA under
DP-SGD, is not reachable yet: ``privacy.record`` is refused for the adapted encoder (per-sample gradients through
its Hugging Face module are unchecked) and for a step that trains only some of the parameters.
"""

from __future__ import annotations

import torch

from hetfed.algorithms._personal import PartlyPersonal, initial_model
from hetfed.algorithms.fedavg import FedAvg, train_clients
from hetfed.algorithms.registry import AlgorithmSpec, Capabilities, PrivacyRow, register
from hetfed.engine.types import Broadcast, ClientData, ClientState, ServerState, Upload, split_state


class FFALoRA(PartlyPersonal):
    """FedAvg on the adapters' B matrices and the head; every client holds the same frozen A matrices."""

    def personal_names(self) -> tuple[str, ...]:
        return self.model.lora_names("A")  # type: ignore[attr-defined]  # a lora_encoder (Capabilities.model_kinds)

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        shared = bc.stacked(len(data.client_ids))
        local, kept_opt = split_state(states)
        params, opt_state, loss = train_clients(self, {**shared, **local}, kept_opt, data, bc.lr,
                                                trainable=list(shared))  # A held fixed
        return Upload.of(data, params, bc.params, loss), {**local, **opt_state}

    def reported_state(self, state: ServerState) -> ServerState:
        """The server's complete model: the averaged B and head with the A every client holds — what it scores on
        the global test set and a run saves (:func:`hetfed.interface.reported`)."""
        device = next(iter(state.params.values())).device
        frozen = {k: v.to(device) for k, v in initial_model(self).items() if k in self.personal_names()}
        return ServerState({**state.params, **frozen}, state.round, state.extra)

    @torch.no_grad()
    def evaluate_server(self, state: ServerState, x_global: torch.Tensor, y_global: torch.Tensor) -> dict[str, float]:
        """:meth:`reported_state`'s model scored as FedAvg's (a partly personal method's server has no whole model;
        this one's is whole)."""
        return FedAvg.evaluate_server(self, state, x_global, y_global)


register(AlgorithmSpec(
    "ffa_lora", FFALoRA, "LoRA adapters over a frozen encoder with A frozen at one shared random draw: only B (and "
    "the head) trained and averaged", "Sun et al. 2024, Improving LoRA in Privacy-preserving Federated Learning",
    capabilities=Capabilities(uploads="every adapter's B and the head, sample count, training loss", private=True,
                              stacks_runs=True,
                              model_kinds=("lora_encoder",),
                              model_reason="it freezes LoRA adapters' A matrices: use model.kind lora_encoder with "
                                           "embed.kind wordpiece", whole_model=False),
    model={"kind": "lora_encoder"},
    privacy=(
        PrivacyRow(
            method="FFA-LoRA",
            config="`algorithm: ffa_lora` + `model.kind: lora_encoder`",
            params="every adapter's B, the head",
            extra="`train_loss`",
            stays="data; the frozen A matrices (every client draws the same) and encoder; optimiser state when kept",
        ),
    ),
    family="global", venue="ICLR 2024",
))
