"""FedBABU (Oh, Kim, Yun 2022, "FedBABU: Towards Enhanced Representation for Federated Image
Classification").

During federated training only the *body* learns: the head (the classifier layer) keeps
its random initialisation on the server and on every client, so local updates cannot
pull the head towards a client's classes and the body learns a representation shared
by all (the paper's "body aggregation, body update"). Clients upload the body (and the
unchanged head, so the server pipeline sees the whole model); the server averages.

Personalisation, after the rounds: every client fine-tunes the *whole* model from the
global one on its own training data for ``params.finetune_epochs`` epochs (the paper's
evaluation protocol; it varies the fine-tuning epochs — 5 is our default). Two rows:
``fedbabu`` (the global model: trained body, random head) and ``fedbabu_ft`` (each
client's fine-tuned model; the headline). The optimiser state is fresh each round and
in the fine-tuning.
"""

from __future__ import annotations

import time
from dataclasses import replace

import torch
from pydantic import Field

from hetfed.algorithms._personal import body_of, second_pass
from hetfed.algorithms.fedavg import FedAvg
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.evaluate import Predictor
from hetfed.engine.local import train_stack
from hetfed.engine.types import Broadcast, ClientData, ClientState, Upload, split_state
from hetfed.models.base import prefixed, under, without

TUNED = "babu_ft."  # a client's fine-tuned model in its state
VIEWS = ("fedbabu", "fedbabu_ft")


class FedBABUParams(AlgorithmParams):
    finetune_epochs: float = Field(5.0, gt=0, description="epochs each client fine-tunes the whole model after "
                                                          "the rounds (the paper varies it)")


class FedBABU(FedAvg):
    """Body-only local updates with a fixed random head; whole-model fine-tuning per client at the end."""

    def __init__(self, model, train, params=None, context=None):
        super().__init__(model, train, params, context)
        self._body = body_of(model, self.spec.name)

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        return split_state(super().client_init(client_id, gen))[0]  # no optimiser state: fresh each round

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        local = without(states, TUNED)
        params, _, loss = train_stack(self.model, {**bc.stacked(n), **local}, data, self.schedule,
                                      self.train.optimizer, bc.lr, trainable=[*self._body, *local])
        upload = Upload.of(data, params, bc.params, loss)
        return upload, {**states, **{k: params[k] for k in local}}

    def personalise(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[ClientState, dict]:
        n, t0 = len(data.client_ids), time.perf_counter()
        local = without(states, TUNED)
        schedule = replace(self.schedule, epochs=self.params.finetune_epochs, steps=None)
        tuned, _, _ = train_stack(self.model, {**bc.stacked(n), **local}, second_pass(data, 2), schedule,
                                  self.train.optimizer, self.train.optimizer.lr)
        view = VIEWS[1]  # the row the fine-tuning's epochs and seconds are reported in
        info = {f"epochs.{view}": torch.full((n,), self.params.finetune_epochs, dtype=torch.float64),
                f"seconds.{view}": torch.full((n,), (time.perf_counter() - t0) / n, dtype=torch.float64)}
        return {**states, **prefixed(tuned, TUNED)}, info

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        if view in (None, self.capabilities.federated_view):
            local = without(states, TUNED)
            return super().predictor(bc, local, n, None)
        return Predictor(self.model, under(states, TUNED), True)


register(AlgorithmSpec(
    "fedbabu", FedBABU, "only the body is trained and averaged (the head stays at its random init); each client "
    "fine-tunes the whole model after the rounds",
    "Oh, Kim, Yun 2022, FedBABU: Towards Enhanced Representation for Federated Image Classification",
    FedBABUParams,
    Capabilities(uploads="shared parameters (the head unchanged), sample count, training loss; after the rounds, "
                         "only the fine-tuning's epochs and seconds",
                 private=True, views=VIEWS, federated_view="fedbabu", primary_view="fedbabu_ft", personalises=True,
                 stacks_runs=True),
    quick={"finetune_epochs": 1.0},
    privacy=(
        PrivacyRow(
            method="FedBABU",
            config="`algorithm: fedbabu`",
            params="shared model parameters (the body trained; the head exactly as received)",
            extra="`train_loss`",
            stays="data; after the rounds, its fine-tuned model (`babu_ft.<name>`)",
        ),
    ),
    family="personalised", venue="ICLR 2022",
))
