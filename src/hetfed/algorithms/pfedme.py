"""pFedMe (T. Dinh, Tran, Nguyen 2020, "Personalized Federated Learning with Moreau Envelopes").

Each client's personalised model θ_i solves, for its local copy w of the global model,
the Moreau-envelope problem min_θ f_i(θ) + λ/2‖θ − w‖². Each local step of a round
(Algorithm 1; a step is one batch D):

1. θ̃ ≈ argmin_θ f_i(θ; D) + λ/2‖θ − w‖²: ``params.inner_steps`` K steps of gradient descent
   θ ← θ − η_p(∇f_i(θ; D) + λ(θ − w)), step ``params.personal_lr`` η_p, from the θ of the
   previous step (θ starts each round at the received global model, as the authors' code);
2. w ← w − ηλ(w − θ̃), η the run's optimiser lr.

The client uploads w; the server moves the global model by β towards the average,
w ← (1 − β)w + β·avg(w_i) — hetfed's server step ``server.optimizer.lr`` = β (1: FedAvg's
average; the paper also uses β = 2). A client predicts with its last θ̃.

Vectorised exactly: the outer step is the engine's optimiser on the loss λ/2‖w − θ̃‖²
(its gradient λ(w − θ̃)); the inner solver runs inside that loss (the ``objective``
hook) for every client of the stack at once, and a client whose data is used up in a
step (fewer batches than others) keeps its θ. The paper's outer step is plain SGD:
with momentum in ``train.optimizer`` it differs. Defaults λ = 15, η_p = 0.09, K = 5 are
the authors' command for MNIST.
"""

from __future__ import annotations

from typing import cast

import torch
from pydantic import Field

from hetfed.algorithms._personal import initial_model
from hetfed.algorithms.fedavg import FedAvg
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.evaluate import Predictor
from hetfed.engine.local import StackObjective, cross_entropy, train_stack
from hetfed.engine.types import Broadcast, ClientData, ClientState, Params, Upload, split_state
from hetfed.models.base import Noise, prefixed, under, without

THETA = "pfedme.theta."  # the personalised model θ_i in a client's state


class PFedMeParams(AlgorithmParams):
    lam: float = Field(15.0, gt=0, description="λ, the Moreau envelope's weight λ/2‖θ − w‖²")
    personal_lr: float = Field(0.09, gt=0, description="η_p, the inner solver's step")
    inner_steps: int = Field(5, ge=1, description="K, gradient steps of the inner solver per batch")


class PFedMe(FedAvg):
    """Bi-level: a personalised θ per client by an inner solver, the local w pulled towards it."""


    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        local, _ = split_state(super().client_init(client_id, gen))  # optimiser state fresh each round
        return {**local, **{THETA + k: v.clone() for k, v in initial_model(self).items()}}

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        local = without(states, THETA)
        shared = list(bc.params)
        glob = bc.stacked(n)
        # θ starts at the received global model, and the loss carries it from step to step (its output)
        objective = StackObjective(self._loss, dict(glob), outputs=tuple(glob))
        trained, _, loss = train_stack(self.model, {**glob, **local}, data, self.schedule, self.train.optimizer, bc.lr,
                                       objective=objective)
        params, theta = objective.written(trained)
        upload = Upload.of(data, params, shared, loss)
        return upload, {**{k: params[k] for k in local}, **prefixed(theta, THETA)}

    def _loss(self, p: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, noise: Noise,
              inputs: Params) -> tuple[torch.Tensor, torch.Tensor]:
        """The outer step's loss λ/2‖w − θ̃‖² per client (its gradient λ(w − θ̃)) and the loss it reports, f(θ̃):
        first θ̃ by K steps of the inner solver from the θ in ``inputs`` (written back in place; a client without
        rows in this step keeps its θ)."""
        lam, eta_p, steps = self.params.lam, self.params.personal_lr, self.params.inner_steps
        buffers = set(self.model.buffer_names)
        local = {k: v.detach() for k, v in p.items() if k not in inputs}
        w = {k: p[k].detach() for k in inputs}
        current = dict(inputs)
        for _ in range(steps):
            with torch.enable_grad():  # batch norm's running statistics are no unknown of the inner problem
                leaves = {k: v.detach().requires_grad_(True) for k, v in current.items() if k not in buffers}
                f = cross_entropy(self.model, {**current, **leaves, **local}, xb, yb, mask, noise)
                grads = torch.autograd.grad(f.sum(), list(leaves.values()))
            current = {**current, **{k: (v - eta_p * (g + lam * (v - w[k]))).detach()
                                     for (k, v), g in zip(leaves.items(), grads, strict=True)},
                       # θ's running statistics move with each of its passes (the step hands the last to w)
                       **{k: v for k, v in noise.updates.items() if k in buffers}}
        active = mask.sum(1) > 0
        with torch.no_grad():
            for k, v in current.items():
                inputs[k].copy_(torch.where(active.view(-1, *([1] * (v.dim() - 1))), v, inputs[k]))
            reported = cross_entropy(self.model, {**inputs, **local}, xb, yb, mask)
        pull = sum(0.5 * lam * (p[k] - inputs[k]).pow(2).flatten(1).sum(1) for k in inputs if k not in buffers)
        return cast(torch.Tensor, pull), reported

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """Each client predicts with its personalised θ_i."""
        local = without(states, THETA)
        theta = under(states, THETA)
        return Predictor(self.model, {**theta, **local}, True)


register(AlgorithmSpec(
    "pfedme", PFedMe, "a personalised model per client from a Moreau-envelope inner problem; the local model is "
    "pulled towards it and averaged",
    "T. Dinh, Tran, Nguyen 2020, Personalized Federated Learning with Moreau Envelopes", PFedMeParams,
    Capabilities(stacks_runs=True, private=True, personalises=True),
    quick={"inner_steps": 2},
    privacy=(
        PrivacyRow(
            method="pFedMe",
            config="`algorithm: pfedme`",
            params="shared model parameters (its local model w after the round)",
            extra="`train_loss`",
            stays="data; its personalised model θ_i (`pfedme.theta.<name>`)",
        ),
    ),
    family="personalised", venue="NeurIPS 2020",
))
