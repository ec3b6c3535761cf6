"""FedDBE (Zhang et al. 2023, "Eliminating Domain Bias for Federated Learning in Representation Space",
NeurIPS), as PFLlib's ``clientdbe`` / ``serverdbe`` (its authors' code).

Two pieces against the bias a client's data puts into its representation ``z``:

- **Personalised representation bias memory (PRBM)**: a vector ``z̄_k`` per client, trained with the model and
  kept on the client, added to the representation before the head: a client trains and predicts with
  ``h(z + z̄_k)``.
- **Mean regularisation (MR)**: each step updates a running mean of the client's batch representations,
  ``r ← (1 − m)·r + m·mean(z over the batch)`` (``m`` = ``params.momentum``, 0.1; ``r`` starts at 0 each round
  and only the current batch's term carries a gradient), and adds ``κ·mean(½(r − z̄_g)²)`` towards the global mean
  ``z̄_g`` (``params.kappa``; PFLlib's default is 0, which turns MR off; the paper tunes κ per dataset).

The global mean is computed once: PFLlib's server has every client train one pass before the first round and
takes the sample-weighted mean of their running means. Here the first round is that pass — its clients train
without PRBM and MR (the model's plain ``h(z)``, as PFLlib's clients do before the global mean exists) and upload
their running means with their update, from which the server fixes ``z̄_g``; from the second round on, DBE
applies. The server averages the model as FedAvg; ``z̄_k`` never leaves its client.
"""

from __future__ import annotations

import torch
from pydantic import Field

from hetfed.algorithms._personal import body_of
from hetfed.algorithms.fedavg import FedAvg, kept_optimizer_state, train_clients
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.evaluate import Predictor
from hetfed.engine.local import StackObjective, client_mean, row_cross_entropy
from hetfed.engine.types import Broadcast, ClientData, ClientState, ServerState, Upload, split_state
from hetfed.models.base import Derived, Model, Noise, Params, ParamSpec

#: the client's representation bias memory z̄_k in its state
MEMORY = "dbe.memory"


class FedDBEParams(AlgorithmParams):
    kappa: float = Field(0.0, ge=0, description="κ, the weight of the mean regularisation (PFLlib's --kl_weight, "
                                                "default 0: off; the paper tunes it per dataset)")
    momentum: float = Field(0.1, gt=0, le=1, description="m, the running mean's momentum (PFLlib's default 0.1)")


class WithMemory(Derived):
    """The model with each client's representation bias memory added before the head: ``h(z + z̄_k)``."""

    def __init__(self, base: Model):
        super().__init__(base, [ParamSpec(MEMORY, (base.latent_dim,), lambda g, s: torch.zeros(s), local=True)])

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        return self.base.head(params, self.base.features(params, x, noise) + params[MEMORY][:, None, :])


class FedDBE(FedAvg):
    """FedAvg with a per-client representation bias memory and a mean regulariser towards the global mean."""

    def __init__(self, model, train, params=None, context=None):
        super().__init__(model, train, params, context)
        body_of(model, "feddbe")  # the representation is the body's output: a model needs one
        self.with_memory = WithMemory(model)

    def server_init(self, gen: torch.Generator) -> ServerState:
        state = super().server_init(gen)
        d = self.model.latent_dim
        return ServerState(state.params, state.round, {**state.extra, "global_mean": torch.zeros(d),
                                                        "known": torch.tensor(0.0)})

    def broadcast(self, state: ServerState, round: int) -> Broadcast:
        bc = super().broadcast(state, round)
        return Broadcast(bc.params, bc.round, bc.lr, {**bc.extra, "global_mean": state.extra["global_mean"],
                                                       "known": state.extra["known"]})

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        shapes = {s.name: torch.zeros(s.shape) for s in self.with_memory.specs()}
        return {**self.model.init_local(gen), MEMORY: torch.zeros(self.model.latent_dim),
                **kept_optimizer_state(self.train, shapes)}

    def _round_objective(self, bc: Broadcast, data: ClientData, known: bool) -> StackObjective:
        """The round's loss over its running mean ``r`` (an output: read after training, the uploaded running mean;
        zero at the round's start) and, once the global mean is ``known``, each client's run's global mean."""
        n, d = len(data.client_ids), self.model.latent_dim
        running = {"r": torch.zeros(n, d, device=data.x.device)}
        if not known:  # the first round: PFLlib's pass before the global mean exists
            return StackObjective(self._first_loss, running, outputs=("r",))
        global_mean = bc.extra_rows("global_mean", n).to(data.x.device)  # each client its own run's (a stack)
        return StackObjective(self._loss, {**running, "global_mean": global_mean}, outputs=("r",))

    def _running(self, z: torch.Tensor, mask: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        """``r ← (1 − m)·r + m·mean(z over the batch)`` for the clients with rows in the step (this batch's term
        carries the gradient), written into ``r`` detached for the next step."""
        real = mask.sum(1)
        batch_mean = (z * mask[..., None]).sum(1) / real.clamp(min=1)[:, None]
        new = torch.where(real[:, None] > 0, (1 - self.params.momentum) * r + self.params.momentum * batch_mean, r)
        r.copy_(new.detach())
        return new

    def _first_loss(self, params: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, noise: Noise,
                    inputs: Params) -> torch.Tensor:
        """The first round's: the model's plain cross-entropy ``h(z)``, the running mean kept for the upload."""
        z = self.model.features(params, xb, noise)
        with torch.no_grad():
            self._running(z, mask, inputs["r"])
        return client_mean(row_cross_entropy(self.model.head(params, z), yb), mask)

    def _loss(self, params: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, noise: Noise,
              inputs: Params) -> tuple[torch.Tensor, torch.Tensor]:
        """DBE's: the cross-entropy of ``h(z + z̄_k)`` plus κ·mean(½(r − z̄_g)²), reporting the cross-entropy."""
        z = self.model.features(params, xb, noise)
        r = self._running(z, mask, inputs["r"])
        ce = client_mean(row_cross_entropy(self.model.head(params, z + params[MEMORY][:, None, :]), yb), mask)
        if self.params.kappa == 0:
            return ce, ce
        return ce + self.params.kappa * (0.5 * (r - inputs["global_mean"]) ** 2).mean(1), ce

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        local, kept_opt = split_state(states)  # local: the model's own parameters and the memory z̄_k
        known = bool(bc.extra["known"] > 0)
        objective = self._round_objective(bc, data, known)
        params = {**bc.stacked(n), **local}
        memory = params.pop(MEMORY)
        if known:
            params[MEMORY] = memory
        else:  # the first round: no memory yet (it would get no gradient), so it is not trained
            kept_opt = {k: v for k, v in kept_opt.items() if not k.endswith(MEMORY)}
        trained, opt_state, loss = train_clients(self, params, kept_opt, data, bc.lr, objective=objective)
        params, running = objective.written(trained)
        params.setdefault(MEMORY, memory)
        upload = Upload.of(data, params, bc.params, loss, running_mean=running["r"])
        kept = {**split_state(states)[1], **opt_state} if opt_state else {}
        return upload, {**{k: params[k] for k in local}, **kept}

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        new = super().aggregate(state, upload)
        mean, known = state.extra["global_mean"], state.extra["known"]
        if not known > 0 and upload.client_ids:  # the first round's running means fix the global mean, once
            w = upload.num_samples.to(torch.float64) / upload.num_samples.to(torch.float64).sum()
            mean = (upload.extra["running_mean"].to(torch.float64) * w[:, None]).sum(0).float().cpu()
            known = torch.tensor(1.0)
        return ServerState(new.params, new.round, {**new.extra, "global_mean": mean, "known": known})

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """Each client predicts with ``h(z + z̄_k)``."""
        local, _ = split_state(states)
        return Predictor(self.with_memory, {**bc.stacked(n), **local}, True)


register(AlgorithmSpec(
    "feddbe", FedDBE, "FedAvg plus a per-client bias memory added to the representation and a mean regulariser "
                      "towards the global representation mean",
    "Zhang et al. 2023, Eliminating Domain Bias for Federated Learning in Representation Space", FedDBEParams,
    Capabilities(uploads="shared parameters, sample count, training loss, the running mean of its representations",
                 whole_round=True, personalises=True, stacks_runs=True, compact_steps=True),
    privacy=(
        PrivacyRow(
            method="FedDBE",
            config="`algorithm: feddbe`",
            params="shared model parameters",
            extra="`train_loss`, `running_mean` (the running mean of its representations this round)",
            stays="data; its representation bias memory (`dbe.memory`); optimiser state when kept",
        ),
    ),
    family="personalised", venue="NeurIPS 2023",
))
