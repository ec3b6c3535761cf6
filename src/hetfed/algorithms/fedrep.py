"""FedRep (Collins et al. 2021, "Exploiting Shared Representations for Personalized Federated Learning").

A shared representation (the body: every layer but the last) and a personal
head, like FedPer, but trained in two phases each round (Algorithm 1 of the
paper): the client first fits its *head* with the received body frozen
(``params.head_epochs`` epochs), then updates the *body* with its new head
frozen (the run's local epochs/steps), and uploads the body. The server
averages the bodies. The authors' code trains the head for ``local_ep −
local_rep_ep`` = 10 − 1 = 9 epochs and the body for 1, hence the default 9
with the run's default of 1 local epoch.

Each phase starts a fresh optimiser (the client's optimiser state is not kept
across phases or rounds). Each phase draws its own batch order.
"""

from __future__ import annotations

from dataclasses import replace

from pydantic import Field

from hetfed.algorithms._personal import PartlyPersonal, head_of, second_pass
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.local import train_stack
from hetfed.engine.types import Broadcast, ClientData, ClientState, Upload, split_state


class FedRepParams(AlgorithmParams):
    head_epochs: float = Field(9.0, gt=0, description="epochs the client fits its head with the body frozen, "
                                                       "before the body's local epochs/steps (authors' code: 9)")


class FedRep(PartlyPersonal):
    """Head first (body frozen), then body (head frozen); the body is shared."""


    def personal_names(self) -> tuple[str, ...]:
        return head_of(self.model, self.spec.name)

    def client_init(self, client_id, gen) -> ClientState:
        return split_state(super().client_init(client_id, gen))[0]  # no optimiser state: fresh each phase

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        local, _ = split_state(states)
        params = {**bc.stacked(n), **local}
        opt, head = self.train.optimizer, list(self.personal_names())
        head_schedule = replace(self.schedule, epochs=self.params.head_epochs, steps=None)
        params, _, _ = train_stack(self.model, params, data, head_schedule, opt, bc.lr, trainable=head)
        body = [*self._body, *self.model.local_names]  # CGAU's rows move with the representation
        params, _, loss = train_stack(self.model, params, second_pass(data, 1), self.schedule, opt, bc.lr,
                                      trainable=body)
        upload = Upload.of(data, params, bc.params, loss)
        return upload, {k: params[k] for k in local}


register(AlgorithmSpec(
    "fedrep", FedRep, "shared body, personal head: each round the head is fitted first (body frozen), then the body",
    "Collins et al. 2021, Exploiting Shared Representations for Personalized Federated Learning", FedRepParams,
    Capabilities(uploads="shared parameters of the body (every layer but the head), sample count, training loss",
                 private=True, personalises=True, stacks_runs=True, whole_model=False),
    quick={"head_epochs": 1.0},
    privacy=(
        PrivacyRow(
            method="FedRep",
            config="`algorithm: fedrep`",
            params="the body: every layer but the classifier head",
            extra="`train_loss`",
            stays="data; its head (the last layer)",
        ),
    ),
    family="personalised", venue="ICML 2021",
))
