"""APFL (Deng, Kamani, Mahdavi 2020, "Adaptive Personalized Federated Learning").

Every client keeps a local model ``v_i`` and a mixing weight ``α_i``; its personalised
model is the parameter mixture ``v̄_i = α_i v_i + (1 − α_i) w``. In each local step on a
batch ξ (Algorithm 1 of the paper, all three from the values before the step):

- the client's copy of the global model: ``w ← w − η ∇f_i(w; ξ)``;
- the local model: ``v ← v − η ∇_v f_i(v̄; ξ)`` (= ``α ∇f_i(v̄)`` by the chain rule);
- with ``params.adapt_alpha``: ``α ← α − η ∇_α f_i(v̄; ξ) = α − η ⟨v − w, ∇f_i(v̄)⟩`` (Eq. 10), kept in
  [0, 1] as the authors' code clips it.

The client uploads ``w``; the server averages (FedAvg, through the server pipeline).
One backward pass serves all three: the per-row objective is ``f(w) + f(α v + (1 − α)
stop_grad(w))`` (the engine's ``objective`` hook), whose gradients are exactly the three
above. A client predicts with ``α_i v_i + (1 − α_i) w`` using the latest global ``w`` it
received; the server's ``w`` is the unseen-client model. ``v_i`` starts as ``w⁰``,
``α_i`` as ``params.alpha``. The reported training loss is ``f(w)`` (comparable with FedAvg's). The
optimiser state is fresh each round.
"""

from __future__ import annotations

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
from hetfed.engine.local import InPlace, StackObjective, cross_entropy, train_stack
from hetfed.engine.types import Broadcast, ClientData, ClientState, Params, Upload, split_state
from hetfed.models.base import Noise, under

LOCAL = "apfl.v."  # the local model v_i in a client's state
ALPHA = "apfl.alpha"  # its mixing weight α_i


class APFLParams(AlgorithmParams):
    alpha: float = Field(0.5, ge=0, le=1, description="α, the local model's initial weight in the mixture")
    adapt_alpha: bool = Field(True, description="learn α per client by gradient descent (Eq. 10); false: fixed α")


class APFL(FedAvg):
    """Local SGD on the global copy, and on the local model through the mixture; α learned."""


    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        local, _ = split_state(super().client_init(client_id, gen))  # the model's own local params (CGAU's rows)
        start = initial_model(self)
        return {**local, **{LOCAL + k: v.clone() for k, v in start.items()}, ALPHA: torch.tensor(self.params.alpha)}

    def _mixture(self, w: Params, v: Params, alpha: torch.Tensor, detach: bool = False) -> Params:
        """``α v + (1 − α) w`` on the shared parameters (``w`` held fixed when ``detach``). Batch norm's running
        statistics are not mixed: the mixture's are the local model's own, which its training passes move (as
        PFLlib's personal model's), while ``w``'s are moved by ``w``'s passes."""
        buffers = set(self.model.buffer_names)
        out = {}
        for k, vk in v.items():
            if k in buffers:
                out[k] = vk
                continue
            a = alpha.view(-1, *([1] * (vk.dim() - 1)))
            wk = w[k].detach() if detach else w[k]
            out[k] = a * vk + (1 - a) * wk
        return out

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        own = {k: v for k, v in states.items() if k.startswith(LOCAL) or k == ALPHA}
        local, _ = split_state({k: v for k, v in states.items() if k not in own})
        params = {**bc.stacked(n), **local, **own}
        shared = list(bc.params)
        trainable = [*shared, *local, *(k for k in own if k != ALPHA or self.params.adapt_alpha)]
        params, _, loss = train_stack(self.model, params, data, self.schedule, self.train.optimizer, bc.lr,
                                      trainable=trainable, objective=StackObjective(self._loss, {}),
                                      project=InPlace(self._clip_alpha))
        upload = Upload.of(data, params, shared, loss)
        return upload, {**{k: params[k] for k in local}, **{k: params[k] for k in own}}

    def _loss(self, p: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, noise: Noise,
              inputs: Params) -> tuple[torch.Tensor, torch.Tensor]:
        """``f(w) + f(α v + (1 − α) stop_grad(w))`` per client (its gradients are the three of Algorithm 1), and
        ``f(w)``, which it reports. ``w``: the shared parameters and the model's own local ones; ``v``: the local
        model (``apfl.v.<shared name>``)."""
        w = {k: t for k, t in p.items() if not k.startswith(LOCAL) and k != ALPHA}
        shared = [k for k in w if LOCAL + k in p]
        mix = {**self._mixture(w, {k: p[LOCAL + k] for k in shared}, p[ALPHA], detach=True),
               **{k: t for k, t in w.items() if k not in shared}}
        global_loss = cross_entropy(self.model, w, xb, yb, mask, noise)
        mixed = cross_entropy(self.model, mix, xb, yb, mask, noise.under(LOCAL) if noise is not None else None)
        return global_loss + mixed, global_loss

    @staticmethod
    def _clip_alpha(p: Params) -> None:
        """α kept in [0, 1] after every step, as the authors' code clips it (in place: the step stays recordable)."""
        if ALPHA in p:
            p[ALPHA].clamp_(0, 1)

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """Each client predicts with ``α_i v_i + (1 − α_i) w`` (w: the global model it last received)."""
        local, _ = split_state({k: v for k, v in states.items() if not k.startswith(LOCAL) and k != ALPHA})
        v = under(states, LOCAL)
        return Predictor(self.model, {**self._mixture(bc.stacked(n), v, states[ALPHA]), **local}, True)


register(AlgorithmSpec(
    "apfl", APFL, "a local model per client mixed with the global one, α·v + (1 − α)·w, α learned on local data",
    "Deng, Kamani, Mahdavi 2020, Adaptive Personalized Federated Learning", APFLParams,
    Capabilities(stacks_runs=True, private=True, personalises=True),
    privacy=(
        PrivacyRow(
            method="APFL",
            config="`algorithm: apfl`",
            params="shared model parameters (its copy of the global model after local SGD)",
            extra="`train_loss`",
            stays="data; its local model v_i (`apfl.v.<name>`) and mixing weight α_i (`apfl.alpha`)",
        ),
    ),
    family="personalised", venue="arXiv 2020",
))
