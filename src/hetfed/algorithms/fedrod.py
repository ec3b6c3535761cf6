"""FedRoD (Chen & Chao 2022, "On Bridging Generic and Personalized Federated Learning for Image
Classification", ICLR).

One body and two heads: a *generic* head, shared and averaged with the body, and a *personal* head each client
keeps. Every step (as PFLlib's ``clientrod`` and the authors' code) a client

1. trains body and generic head on the balanced-softmax loss (Ren et al. 2020), the cross-entropy of the generic
   logits shifted by the log of its own class counts, ``CE(g(z) + log n_{k,·}, y)``, so the generic model
   learns the class-balanced objective under label skew;
2. trains its personal head on the cross-entropy of the sum ``CE(g(z) + p(z), y)`` with the representation ``z``
   and the generic logits ``g(z)`` held fixed.

Both gradients come from one forward; they touch disjoint parameters, so one step of the sum equals PFLlib's two
optimisers stepping in turn. A client predicts with ``g(z) + p(z)``; the server's model (body and generic head)
is the generic model for unseen clients. Every personal head starts as the server's initial head (PFLlib copies
the model's head). The class counts never leave the client.
"""

from __future__ import annotations

import torch

from hetfed.algorithms._personal import head_of, initial_model
from hetfed.algorithms.fedavg import FedAvg, kept_optimizer_state
from hetfed.algorithms.registry import (
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.evaluate import Predictor
from hetfed.engine.local import StackObjective, client_mean, row_cross_entropy
from hetfed.engine.types import Broadcast, ClientData, ClientState, split_state
from hetfed.models.base import Derived, Model, Noise, Params, ParamSpec, under

#: the personal head's parameters in a client's state
PERSONAL = "rod."


def balanced_softmax_loss(logits: torch.Tensor, y: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Each row's ``CE(logits + log n, y)`` ``[n, batch]`` for stacked logits [n, batch, C] and each client's
    class counts [n, C] (a class the client does not hold gets logit −∞: out of its softmax)."""
    return row_cross_entropy(logits + counts.log()[:, None, :], y)


class TwoHeads(Derived):
    """A model whose logits are its generic head's plus a personal head's (``rod.<head name>``) on one body."""

    def __init__(self, base: Model):
        head = set(head_of(base, "fedrod"))
        super().__init__(base, [ParamSpec(PERSONAL + s.name, s.shape, s.init, local=True)
                                for s in base.specs() if s.name in head])

    def personal(self, params: Params) -> Params:
        return under(params, PERSONAL)

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        z = self.base.features(params, x, noise)
        return self.base.head(params, z) + self.base.head({**params, **self.personal(params)}, z)


class FedRoD(FedAvg):
    """FedAvg of body and generic head on the balanced-softmax loss; a personal head per client on top."""

    def __init__(self, model, train, params=None, context=None):
        super().__init__(model, train, params, context)
        self.both = TwoHeads(model)
        self._head = head_of(model, "fedrod")

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        start = initial_model(self)
        personal = {PERSONAL + k: start[k].clone() for k in self._head}
        shapes = {s.name: torch.zeros(s.shape) for s in self.both.specs()}
        return {**self.model.init_local(gen), **personal, **kept_optimizer_state(self.train, shapes)}

    def _objective(self, bc: Broadcast, data: ClientData, states: ClientState) -> StackObjective:
        return StackObjective(self._loss, {"counts": data.label_counts(self.model.n_classes)})

    def _loss(self, params: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, noise: Noise,
              inputs: Params) -> tuple[torch.Tensor, torch.Tensor]:
        """The balanced-softmax loss of the generic head (each client's class counts: ``inputs["counts"]``) plus
        the personalised model's cross-entropy, which is what a client reports."""
        model = self.model
        z = model.features(params, xb, noise)
        generic = model.head(params, z)
        fixed = {k: v.detach() for k, v in params.items()}
        personal = model.head({**fixed, **self.both.personal(params)}, z.detach())
        ce = row_cross_entropy(generic.detach() + personal, yb)
        return client_mean(balanced_softmax_loss(generic, yb, inputs["counts"]) + ce, mask), client_mean(ce, mask)

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """Each client predicts with the generic head's logits plus its personal head's."""
        local, _ = split_state(states)
        return Predictor(self.both, {**bc.stacked(n), **local}, True)


register(AlgorithmSpec(
    "fedrod", FedRoD, "a shared body and generic head trained on the balanced-softmax loss, and a personal head per "
                      "client added to the generic logits",
    "Chen & Chao 2022, On Bridging Generic and Personalized Federated Learning for Image Classification",
    capabilities=Capabilities(stacks_runs=True, private=True, personalises=True, compact_steps=True),
    privacy=(
        PrivacyRow(
            method="FedRoD",
            config="`algorithm: fedrod`",
            params="shared model parameters (the body and the generic head)",
            extra="`train_loss` (its personalised model's cross-entropy)",
            stays="data; its label counts; its personal head (`rod.<head name>`); optimiser state when kept",
        ),
    ),
    family="personalised", venue="ICLR 2022",
))
