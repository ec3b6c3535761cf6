"""Per-FedAvg (Fallah, Mokhtari, Ozdaglar 2020, "Personalized Federated Learning with Theoretical
Guarantees: A Model-Agnostic Meta-Learning Approach").

The federation learns an initialisation ``w`` that is good *after one local gradient
step*: F_i(w) = f_i(w − α∇f_i(w)). Each local step of a client (Algorithm 1) takes
independent batches D, D' (and D'' for the Hessian-free variant):

    w̃ = w − α ∇f_i(w; D)
    first order (``variant: fo``):    w ← w − β ∇f_i(w̃; D')
    Hessian-free (``variant: hf``):   w ← w − β (I − α ∇²f_i(w; D'')) ∇f_i(w̃; D')

α is ``params.inner_lr``; β is the run's optimiser (``train.optimizer``, its lr, batch
size B per batch). The server averages (FedAvg, through the server pipeline).

Vectorised exactly: one step draws a batch of 2B (FO) or 3B (HF) rows per client and
splits it into D, D', D'' (independent batches, as the paper's); the step's loss
(the engine's ``objective`` hook) is f(w − α·stop_grad(∇f(w; D)); D') — its gradient
is ∇f(w̃; D') — minus, for HF, α⟨∇f(w; D''), stop_grad(∇f(w̃; D'))⟩, whose gradient
is the exact Hessian-vector product α∇²f(w; D'')∇f(w̃; D') (the paper approximates it by
finite differences). An epoch is one pass over the client's data, so it has half (a
third) as many steps as FedAvg's.

Evaluation: each client first adapts the received ``w`` by one gradient step of size α
on its whole training split (the paper's one-step adaptation, taken on the full split
so it is deterministic), then scores. The global test set is scored by the adapted
models; ``server_accuracy`` is the unadapted ``w``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import numpy as np
import torch
from pydantic import Field

from hetfed.algorithms.fedavg import FedAvg
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.evaluate import ClientEvalData, Predictor, call_rows, size_blocks
from hetfed.engine.local import StackObjective, cross_entropy, row_cross_entropy, train_stack
from hetfed.engine.types import (
    Broadcast,
    ClientData,
    ClientState,
    Params,
    Upload,
    index_on,
    padded_rows,
    split_state,
    take_rows,
)
from hetfed.models.base import Noise


class PerFedAvgParams(AlgorithmParams):
    inner_lr: float = Field(0.01, gt=0, description="α, the step of the one-step adaptation (inner step)")
    variant: Literal["fo", "hf"] = Field("fo", description="fo: first-order MAML; hf: Hessian-free (exact "
                                                            "Hessian-vector product on a third batch)")


#: input floats of one block of the evaluation's adaptation step, for the whole stack (its activations are larger:
#: ~24x for PFLlib's CNN on 28x28 images)
ADAPT_BLOCK_FLOATS = 2**23


def _parts(t: torch.Tensor, size: int, k: int) -> torch.Tensor:
    """The k-th block of ``size`` columns of a batch ``[n, width, …]`` (empty past its width)."""
    return t[:, k * size:(k + 1) * size]


class PerFedAvg(FedAvg):
    """MAML-style local steps; clients adapt the global model by one step before predicting."""


    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        return split_state(super().client_init(client_id, gen))[0]  # optimiser state fresh each round

    @property
    def _batches(self) -> int:
        return 3 if self.params.variant == "hf" else 2

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        local, _ = split_state(states)
        # a step's batch is the meta-step's two (three) batches side by side
        schedule = replace(self.schedule, batch_size=self._batches * self.schedule.batch_size)
        params, _, loss = train_stack(self.model, {**bc.stacked(len(data.client_ids)), **local}, data, schedule,
                                      self.train.optimizer, bc.lr, objective=StackObjective(self._loss, {}))
        upload = Upload.of(data, params, bc.params, loss)
        return upload, {k: params[k] for k in local}

    def _loss(self, p: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, noise: Noise | None,
              inputs: Params) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The meta-loss f(w − α∇f(w; D)); D′) per client (first-order: its gradient at the adapted point; Hessian-free:
        less α times the Hessian-vector product on D″, reporting the meta-loss). D, D′ (, D″): the step's batch's
        column blocks. No tensor of the stack but the parameters: declared with none."""
        model, b, alpha = self.model, self.schedule.batch_size, self.params.inner_lr
        names = [k for k, v in p.items() if v.requires_grad]
        d = [(_parts(xb, b, i), _parts(yb, b, i), _parts(mask, b, i)) for i in range(self._batches)]
        noises = [None if noise is None else noise.columns(i * b, b) for i in range(self._batches)]
        inner = cross_entropy(model, p, *d[0], noises[0])
        g = torch.autograd.grad(inner.sum(), [p[k] for k in names], allow_unused=True)
        w_tilde = {**p, **{k: p[k] - alpha * gk.detach() for k, gk in zip(names, g, strict=True) if gk is not None}}
        outer = cross_entropy(model, w_tilde, *d[1], noises[1])
        if self.params.variant != "hf":
            return outer
        v = torch.autograd.grad(outer.sum(), [p[k] for k in names], retain_graph=True, allow_unused=True)
        hess = cross_entropy(model, p, *d[2], noises[2])
        gh = torch.autograd.grad(hess.sum(), [p[k] for k in names], create_graph=True, allow_unused=True)
        corr = sum((a * c.detach()).flatten(1).sum(1) for a, c in zip(gh, v, strict=True)
                   if a is not None and c is not None)
        return outer - alpha * corr, outer

    def adapted(self, params: Params, x: torch.Tensor, y: torch.Tensor, train: list[np.ndarray]) -> Params:
        """Each client's one-step adaptation ``w − α∇f_i(w; its training split)``, for the clients in blocks of
        similar split sizes (:func:`~hetfed.engine.evaluate.size_blocks`, as the evaluation blocks them): the stack
        padded to its largest split computed ~4× the samples there are on PFLlib's protocol (Dirichlet 0.1; 81 % of a
        round's arithmetic was this step, ``benchmarks/protocol_flops.py``)."""
        sizes = np.array([len(i) for i in train], dtype=np.int64)
        blocks = size_blocks(sizes, call_rows=call_rows(self.model, x))
        if len(blocks) == 1:
            return self._adapted(params, x, y, train)
        out = {k: torch.empty_like(v) for k, v in params.items()}
        for block in blocks:
            rows = index_on(block, next(iter(params.values())).device)
            part = self._adapted({k: v.index_select(0, rows) for k, v in params.items()}, x, y,
                                 [train[k] for k in block])
            for k, v in part.items():
                out[k].index_copy_(0, rows, v)
        return out

    def _adapted(self, params: Params, x: torch.Tensor, y: torch.Tensor, train: list[np.ndarray]) -> Params:
        """:meth:`adapted` of one block. The gradient of each client's mean loss is summed over blocks of its
        samples (:data:`ADAPT_BLOCK_FLOATS` input floats for the stack at a time): one forward over every client's
        whole split built tensors past 2³¹ elements on a CNN (refused by CUDA's kernels) and past memory."""
        width = max((len(i) for i in train), default=0)
        if width == 0:
            return params
        idx, weights = padded_rows(train, x.device)
        count = weights.sum(1, keepdim=True).clamp(min=1)
        block = max(1, ADAPT_BLOCK_FLOATS // max(1, len(train) * x[0].numel()))
        leaves = {k: v.detach().requires_grad_(True) for k, v in params.items()}
        grads = [torch.zeros_like(v) for v in leaves.values()]
        with torch.enable_grad():
            for a in range(0, width, block):
                rows = idx[:, a:a + block]
                loss = row_cross_entropy(self.model.forward(leaves, take_rows(x, rows), None), take_rows(y, rows))
                part = torch.autograd.grad((loss * weights[:, a:a + block] / count).sum(), list(leaves.values()))
                for g, p in zip(grads, part, strict=True):
                    g.add_(p)
        return {k: (v - self.params.inner_lr * g).detach() for (k, v), g in zip(leaves.items(), grads, strict=True)}

    @torch.no_grad()
    def fitted_predictor(self, bc: Broadcast, states: ClientState, data: ClientEvalData,
                         view: str | None = None) -> Predictor:
        """The meta-model after each client's one step on its training rows (without them, the meta-model)."""
        n = len(data.client_ids)
        local, _ = split_state(states)
        params = {**bc.stacked(n), **local}
        if data.train is not None:
            params = self.adapted(params, data.x, data.y, data.train)
        return Predictor(self.model, params, True)


register(AlgorithmSpec(
    "perfedavg", PerFedAvg, "a MAML-style global model that each client adapts by one local gradient step",
    "Fallah, Mokhtari, Ozdaglar 2020, Personalized Federated Learning with Theoretical Guarantees: "
    "A Model-Agnostic Meta-Learning Approach", PerFedAvgParams,
    Capabilities(stacks_runs=True, private=True, personalises=True, compact_steps=True),
    privacy=(
        PrivacyRow(
            method="Per-FedAvg",
            config="`algorithm: perfedavg`",
            params="shared model parameters (the meta-model after its local steps)",
            extra="`train_loss`",
            stays="data",
        ),
    ),
    family="personalised", venue="NeurIPS 2020",
))
