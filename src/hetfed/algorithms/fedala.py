"""FedALA (Zhang et al. 2023, "FedALA: Adaptive Local Aggregation for Personalized Federated Learning").

Before training, each client merges the received global model Θ into its own previous
model Θ_i element by element (Adaptive Local Aggregation, Eq. 5–7 of the paper):

    Θ̂_i = Θ_i + (Θ − Θ_i) ⊙ W_i     on the top ``params.layers`` parameter tensors,
    Θ̂_i = Θ                         on the lower ones,

with weights W_i ∈ [0, 1] (one per parameter of those tensors, kept by the client, 1 at
first) learned on a random ``params.sample_percent``% of its training data:
W ← clip(W − η ∇_W L(Θ̂_i), 0, 1), where ∇_W L = ∇_Θ̂ L ⊙ (Θ − Θ_i), η = ``params.eta``.
At a client's first ALA the weights train until its loss settles (the standard
deviation of the last ``params.settle_epochs`` epoch losses below
``params.threshold``), later one epoch per round. Then the client trains Θ̂_i with the
run's local schedule, keeps the result as its Θ_i, and uploads it; the server averages.
A client whose model still equals the global one (its first round) skips ALA, as the
authors' code. A client predicts with its Θ_i.

Vectorised: W's training is the engine's ``train_stack`` with W as the parameters
(plain SGD at η, the clip as its ``project``), the loss through Θ̂ (the ``objective``
hook), for the whole stack; in the first ALA each client stops at its own settling
epoch (the others go on), capped at ``params.max_settle_epochs``. The epoch loss is the
epoch's mean batch loss (the authors' code takes its last batch's).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch
from pydantic import Field

from hetfed.algorithms._personal import initial_model
from hetfed.algorithms.fedavg import FedAvg, train_clients
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.config import OptimizerConfig
from hetfed.engine.evaluate import Predictor
from hetfed.engine.local import InPlace, StackObjective, cross_entropy, train_stack
from hetfed.engine.rng import LOCAL_PHASE, derive_seed
from hetfed.engine.types import Broadcast, ClientData, ClientState, Params, Upload, index_on, split_state
from hetfed.models.base import Noise, prefixed, under, without

OWN = "ala.model."  # the client's own model Θ_i
GLOBAL, LOCAL = "ala.glob.", "ala.locl."  # the received Θ and the local parameters, as W's loss reads them
WEIGHT = "ala.w."  # its aggregation weights W_i (top tensors only)
SETTLED = "ala.settled"  # 1 once its first ALA has trained W until the loss settled


class FedALAParams(AlgorithmParams):
    layers: int = Field(2, ge=1, description="p: how many of the model's last parameter tensors ALA weighs "
                                             "(2: the head's weight and bias, the authors' default)")
    sample_percent: float = Field(80.0, gt=0, le=100, description="s: % of the training data W is learned on")
    eta: float = Field(1.0, gt=0, description="η, the step of W's gradient descent")
    threshold: float = Field(0.1, gt=0, description="first ALA: W trains until the std of the last losses is below")
    settle_epochs: int = Field(10, ge=2, description="first ALA: how many last epoch losses the std is over")
    max_settle_epochs: int = Field(100, ge=1, description="first ALA: at most this many epochs")


class FedALA(FedAvg):
    """Element-wise adaptive merging of the global model into the client's own, then local training."""


    def __init__(self, model, train, params=None, context=None):
        super().__init__(model, train, params, context)
        shared = [s.name for s in model.specs() if not s.local and not s.buffer]  # no weights on running statistics
        self._top = shared[-self.params.layers:]

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        local, _ = split_state(super().client_init(client_id, gen))  # optimiser state fresh each round
        start = initial_model(self)
        return {**local, **{OWN + k: v.clone() for k, v in start.items()},
                **{WEIGHT + k: torch.ones_like(start[k]) for k in self._top}, SETTLED: torch.tensor(0.0)}

    def _merged(self, own: Params, glob: Params, w: Params) -> Params:
        """Θ̂ = Θ_i + (Θ − Θ_i) ⊙ W on the top tensors, Θ on the others."""
        return {k: own[k] + (glob[k] - own[k]) * w[k] if k in w else glob[k] for k in glob}

    def _sample(self, data: ClientData) -> ClientData:
        """A random s% of each client's training data (this round's draw)."""
        picks = []
        for idx, seed in zip(data.indices, data.seeds, strict=True):
            m = max(1, int(np.ceil(len(idx) * self.params.sample_percent / 100))) if len(idx) else 0
            rng = np.random.default_rng(derive_seed(seed, LOCAL_PHASE, 3))
            picks.append(np.sort(rng.choice(idx, m, replace=False)) if m else idx)
        return replace(data, indices=picks)

    def _learn_weights(self, own: Params, glob: Params, w: Params, local: Params, data: ClientData,
                       epochs: int) -> tuple[Params, torch.Tensor]:
        """``epochs`` epochs of W's descent on ``data``; returns W and each client's loss per epoch [n, epochs]."""
        sgd = OptimizerConfig(kind="sgd", lr=self.params.eta, momentum=0.0)
        schedule = self.schedule.one_epoch()
        losses = []
        # Θ_i, Θ and the client's local parameters: each client's tensors, declared (its steps recorded, compact)
        inputs = {**prefixed(own, OWN), **prefixed(glob, GLOBAL), **prefixed(local, LOCAL)}
        for epoch in range(epochs):
            step = replace(data, seeds=[derive_seed(s, LOCAL_PHASE, 4, epoch) for s in data.seeds])
            out, _, loss = train_stack(self.model, prefixed(w, WEIGHT), step, schedule, sgd,
                                       self.params.eta, objective=StackObjective(self._weights_loss, inputs),
                                       project=InPlace(self._clip))
            w = {k: out[WEIGHT + k] for k in w}
            losses.append(loss)
        return w, torch.stack(losses, 1)

    def _weights_loss(self, p: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, noise: Noise,
                      inputs: Params) -> torch.Tensor:
        """Each client's cross-entropy of the merged model Θ̂(W) (``p``: W; ``inputs``: Θ_i, Θ, local)."""
        merged = self._merged(under(inputs, OWN), under(inputs, GLOBAL), under(p, WEIGHT))
        return cross_entropy(self.model, {**merged, **under(inputs, LOCAL)}, xb, yb, mask, noise)

    @staticmethod
    def _clip(p: Params) -> None:
        """W kept in [0, 1] after every step (in place: the step stays recordable)."""
        for v in p.values():
            v.clamp_(0, 1)

    def _ala(self, own: Params, glob: Params, w: Params, local: Params, settled: torch.Tensor,
             data: ClientData) -> tuple[Params, Params, torch.Tensor]:
        """Adaptive local aggregation for a stack: (Θ̂, W, settled)."""
        same = torch.stack([(own[k] == glob[k]).flatten(1).all(1) for k in glob]).all(0)  # first round: skip
        sample = self._sample(data)
        w_new, _ = self._learn_weights(own, glob, w, local, sample, 1)
        first = (~same) & (settled < 0.5)
        if bool(first.any()):  # the first ALA: W trains until each client's loss settles
            rows = torch.nonzero(first, as_tuple=True)[0]
            pick = rows.tolist()
            sub = replace(sample, client_ids=[sample.client_ids[i] for i in pick],
                          indices=[sample.indices[i] for i in pick], seeds=[sample.seeds[i] for i in pick])
            w_first = {k: v[rows] for k, v in w.items()}
            own_r, glob_r, local_r = ({k: v[rows] for k, v in d.items()} for d in (own, glob, local))
            running = list(range(len(pick)))
            history: list[torch.Tensor] = []
            for epoch in range(self.params.max_settle_epochs):
                if not running:
                    break
                r = index_on(running, rows.device)
                step = replace(sub, client_ids=[sub.client_ids[i] for i in running],
                               indices=[sub.indices[i] for i in running],
                               seeds=[derive_seed(sub.seeds[i], LOCAL_PHASE, 5, epoch) for i in running])
                w_r, loss = self._learn_weights({k: v[r] for k, v in own_r.items()},
                                                {k: v[r] for k, v in glob_r.items()},
                                                {k: v[r] for k, v in w_first.items()},
                                                {k: v[r] for k, v in local_r.items()},
                                                step, 1)
                w_first = {k: v.index_copy(0, r, w_r[k]) for k, v in w_first.items()}
                full = torch.full((len(pick),), float("nan"))
                full[r.cpu()] = loss[:, 0].cpu()
                history.append(full)
                k = self.params.settle_epochs
                if len(history) > k:
                    recent = torch.stack(history[-k:], 1)
                    running = [i for i in running if float(recent[i].std(unbiased=False)) >= self.params.threshold]
            w_new = {k: v.index_copy(0, rows, w_first[k]) for k, v in w_new.items()}
        w_out = {k: torch.where(same.view(-1, *([1] * (v.dim() - 1))), w[k], w_new[k]) for k, v in w.items()}
        merged = self._merged(own, glob, w_out)
        merged = {k: torch.where(same.view(-1, *([1] * (v.dim() - 1))), glob[k], v) for k, v in merged.items()}
        settled = torch.where(same, settled, torch.ones_like(settled))
        return merged, w_out, settled

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        own = under(states, OWN)
        w = under(states, WEIGHT)
        local = without(states, "ala.")
        glob = bc.stacked(n)
        merged, w, settled = self._ala(own, glob, w, local, states[SETTLED], data)
        params, _, loss = train_clients(self, {**merged, **local}, {}, data, bc.lr)
        upload = Upload.of(data, params, bc.params, loss)
        return upload, {**{k: params[k] for k in local}, **{OWN + k: params[k] for k in bc.params},
                        **prefixed(w, WEIGHT), SETTLED: settled}

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """Each client predicts with its own model Θ_i (its last local training)."""
        local = without(states, "ala.")
        return Predictor(self.model, {**under(states, OWN), **local}, True)


register(AlgorithmSpec(
    "fedala", FedALA, "each client merges the global model into its own element-wise, with weights it learns on "
    "its data, then trains",
    "Zhang et al. 2023, FedALA: Adaptive Local Aggregation for Personalized Federated Learning", FedALAParams,
    Capabilities(stacks_runs=True, private=True, personalises=True),
    quick={"max_settle_epochs": 3, "settle_epochs": 2},
    privacy=(
        PrivacyRow(
            method="FedALA",
            config="`algorithm: fedala`",
            params="shared model parameters (its model after ALA and local training)",
            extra="`train_loss`",
            stays="data; its own model Θ_i (`ala.model.<name>`), its aggregation weights W_i (`ala.w.<name>`)",
        ),
    ),
    family="personalised", venue="AAAI 2023",
))
