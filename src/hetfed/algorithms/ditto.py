"""Ditto (Li et al. 2021, "Ditto: Fair and Robust Federated Learning Through Personalization").

Every client keeps a personal model ``v_k`` beside the global model ``w``.
Each round a selected client (Algorithm 1 of the paper):

1. trains the received global model ``w^t`` with local SGD, as FedAvg, and uploads it;
2. updates its personal model on ``F_k(v) + λ/2‖v − w^t‖²`` (Eq. 2), proximal to the
   *received* ``w^t``, for the same local epochs/steps (``params.personal_epochs``
   to change them): ``v ← v − η(∇F_k(v) + λ(v − w^t))``.

The server averages the global models (FedAvg, through the server pipeline). A
client predicts with ``v_k``; the server's ``w`` is the unseen-client model.
Every ``v_k`` starts as ``w^0`` (the paper's initialisation); a client that is
not sampled in a round keeps its ``v_k`` unchanged.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from pydantic import Field

from hetfed.algorithms._personal import initial_model, second_pass
from hetfed.algorithms.fedavg import FedAvg, train_clients
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.evaluate import Predictor
from hetfed.engine.local import LocalSchedule, Proximal, train_stack
from hetfed.engine.types import Broadcast, ClientData, ClientState, Upload, split_state
from hetfed.models.base import prefixed, under, without

#: the personal model's parameters in a client's state
PERSONAL = "ditto."


class DittoParams(AlgorithmParams):
    lam: float = Field(0.1, ge=0, description="λ, the weight of λ/2·‖v − w‖² tying the personal model to the global")
    personal_epochs: float | None = Field(
        None, gt=0, description="epochs of the personal model's update per round (None: the run's local epochs/steps)")


class Ditto(FedAvg):
    """FedAvg for the global model plus a personal model per client, proximal to the received global."""


    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        state = super().client_init(client_id, gen)
        local, _ = split_state(state)
        personal = {**{k: v.clone() for k, v in initial_model(self).items()},
                    **{k: v.clone() for k, v in local.items()}}
        return {**state, **prefixed(personal, PERSONAL)}

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        rest = without(states, PERSONAL)
        local, kept_opt = split_state(rest)
        w_t = bc.stacked(n)
        params, opt_state, loss = train_clients(self, {**w_t, **local}, kept_opt, data, bc.lr)
        personal = under(states, PERSONAL)
        lam = self.params.lam
        personal, _, _ = train_stack(self.model, personal, second_pass(data, 1), self._personal_schedule(),
                                     self.train.optimizer, bc.lr, regulariser=Proximal(bc.params, lam) if lam else None)
        upload = Upload.of(data, params, bc.params, loss)
        return upload, {**{k: params[k] for k in local}, **opt_state,
                        **prefixed(personal, PERSONAL)}

    def _personal_schedule(self) -> LocalSchedule:
        """The personal model's local work: the method's, or ``personal_epochs`` of it."""
        return self.schedule if self.params.personal_epochs is None else replace(
            self.schedule, epochs=self.params.personal_epochs, steps=None)

    def private_steps(self, n: int) -> int:
        """The global model's steps and the personal model's: both go over the client's data every round."""
        return super().private_steps(n) + self._personal_schedule().n_steps(n)

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """Each client predicts with its personal model ``v_k``."""
        return Predictor(self.model, under(states, PERSONAL), True)


register(AlgorithmSpec(
    "ditto", Ditto, "FedAvg's global model plus a personal model per client, tied to it by λ/2·‖v − w‖²",
    "Li et al. 2021, Ditto: Fair and Robust Federated Learning Through Personalization", DittoParams,
    Capabilities(private=True, personalises=True, stacks_runs=True, plain_steps=True),
    privacy=(
        PrivacyRow(
            method="Ditto",
            config="`algorithm: ditto`",
            params="shared model parameters (the global model after local SGD)",
            extra="`train_loss`",
            stays="data; its personal model v_k (`ditto.<name>`); optimiser state when kept",
        ),
    ),
    family="personalised", venue="ICML 2021",
))
