"""FedCP (Zhang, Hua, Wang, Song, Xue, Ma, Guan 2023, "FedCP: Separating Feature Information for Personalized
Federated Learning via Conditional Policy", KDD), as PFLlib's ``clientcp`` / ``servercp``.

Each sample's feature vector z is split, feature by feature, between a client's own head and a global head by a
**conditional policy**: the shared conditional selection module (CS: a linear layer to 2d, layer norm, ReLU)
reads ``z ⊙ ĉ`` — ĉ the client's normalised context vector — and a Gumbel softmax over each feature's two
entries gives the shares ``p + g = 1``; the output is ``head_p(z ⊙ p) + head_g(z ⊙ g)``. The loss adds
``λ·MMD(z, z_base)``, the RBF maximum mean discrepancy (bandwidths 10, 15, 20, 50) between the features of the
client's body and those of the received global body, frozen (``params.lam``, PFLlib's ``--lamda`` default 1.0).

A client trains its body, its own head and CS (the global head and the frozen body fixed), then uploads its body,
CS and ``½(head_p + head_g)`` as its global head; its context becomes the sum of its own head's weights over the
classes (PFLlib's product of the head's weight matrices, for a one-layer head). The server averages body, CS and
global head (FedAvg, through the server pipeline); own heads and contexts stay on the clients (a context starts
as a uniform draw, as PFLlib's ``torch.rand``).

The Gumbel draws come from the client's own stream (:meth:`hetfed.models.base.Noise.uniforms`: the same numbers on
every executor). Difference from PFLlib: a client predicts with the policy's softmax without Gumbel noise (PFLlib
draws noise at test time too, so its predictions are random).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from hetfed.algorithms._personal import PartlyPersonal, head_of, initial_model
from hetfed.algorithms.fedavg import kept_optimizer_state, train_clients
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.evaluate import Predictor
from hetfed.engine.local import StackObjective, client_mean, row_cross_entropy
from hetfed.engine.types import (
    Broadcast,
    ClientData,
    ClientState,
    Params,
    ServerState,
    Upload,
    split_state,
)
from hetfed.errors import ConfigError
from hetfed.models.base import Derived, Model, Noise, linear_init

CS = "cp.cs."
HEAD_G = "cp.head_g."
BASE = "cp.base."  # the received body, frozen for the round (the MMD's reference)
CONTEXT = "cp.context"
BANDWIDTHS = (10.0, 15.0, 20.0, 50.0)


class FedCPParams(AlgorithmParams):
    lam: float = Field(1.0, ge=0, description="λ, the MMD term's weight (PFLlib's --lamda default)")
    tau: float = Field(1.0, gt=0, description="the Gumbel softmax's temperature (PFLlib's 1)")


def cs_init(gen: torch.Generator, d: int) -> Params:
    """``nn.Linear(d, 2d)`` and ``nn.LayerNorm(2d)`` initialisation, from ``gen``."""
    weight, bias = linear_init(gen, d, 2 * d)
    return {CS + "weight": weight, CS + "bias": bias, CS + "norm_weight": torch.ones(2 * d),
            CS + "norm_bias": torch.zeros(2 * d)}


def policy(params: Params, gate_in: torch.Tensor, u: torch.Tensor | None, tau: float) -> tuple[torch.Tensor,
                                                                                                torch.Tensor]:
    """The shares (p, g) [n, b, d] of each feature: a Gumbel softmax (``u``: uniform draws [n, b, 2d]; None: the
    plain softmax) over ``ReLU(LayerNorm(W·gate_in + b))`` viewed as two entries per feature."""
    h = torch.einsum("nbi,noi->nbo", gate_in, params[CS + "weight"]) + params[CS + "bias"][:, None, :]
    h = F.layer_norm(h, h.shape[-1:]) * params[CS + "norm_weight"][:, None, :] + params[CS + "norm_bias"][:, None, :]
    h = torch.relu(h)
    if u is not None:
        h = h - torch.log(-torch.log(u.clamp(min=1e-20)))  # + Gumbel(0, 1) noise
    shares = torch.softmax((h / tau).view(*h.shape[:2], 2, -1), dim=2)
    return shares[:, :, 0], shares[:, :, 1]


def mmd(x: torch.Tensor, y: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each client's RBF MMD [n] between its rows of ``x`` and ``y`` [n, b, d] (PFLlib's ``MMD(x, y, 'rbf')``:
    the mean of ``XX + YY − 2XY`` over the pairs of real rows)."""
    def sq(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a * a).sum(-1)[:, :, None] + (b * b).sum(-1)[:, None, :] - 2 * a @ b.transpose(1, 2)

    dxx, dyy, dxy = sq(x, x), sq(y, y), sq(x, y)
    k = sum(torch.exp(-0.5 * dxx / a) + torch.exp(-0.5 * dyy / a) - 2 * torch.exp(-0.5 * dxy / a) for a in BANDWIDTHS)
    pairs = mask[:, :, None] * mask[:, None, :]
    return (torch.as_tensor(k) * pairs).sum((1, 2)) / pairs.sum((1, 2)).clamp(min=1)


class Selected(Derived):
    """A client's prediction: ``head_p(z ⊙ p) + head_g(z ⊙ g)`` with the noiseless policy."""

    def __init__(self, base: Model, tau: float):
        super().__init__(base)
        self.tau = tau
        self.own_head = head_of(base, "fedcp")

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        z = self.base.features(params, x, noise)
        ctx = F.normalize(params[CONTEXT], dim=-1)[:, None, :]
        p, g = policy(params, z * ctx, None, self.tau)
        global_head = {**params, **{k: params[HEAD_G + k] for k in self.own_head}}
        return self.base.head(params, z * p) + self.base.head(global_head, z * g)


def context_of(head: Params, names: tuple[str, ...], d: int) -> torch.Tensor:
    """The client's new context [n, d]: its head's weight summed over the classes."""
    weights = [head[k] for k in names if head[k].dim() == 3]
    if len(weights) != 1:
        raise ConfigError("algorithm = 'fedcp' needs a one-layer classifier head (one weight matrix)")
    w = weights[0]
    return w.sum(2) if w.shape[1] == d else w.sum(1)


class FedCP(PartlyPersonal):
    """A per-feature policy splits each sample's features between the client's own head and a global head."""

    def __init__(self, model, train, params=None, context=None):
        super().__init__(model, train, params, context)
        self.selected = Selected(model, self.params.tau)

    def personal_names(self) -> tuple[str, ...]:
        return head_of(self.model, self.spec.name)

    def server_init(self, gen: torch.Generator) -> ServerState:
        state = super().server_init(gen)
        start = initial_model(self)
        global_head = {HEAD_G + k: start[k].clone() for k in self.personal_names()}  # PFLlib: a copy of the head
        return ServerState({**state.params, **global_head, **cs_init(gen, self.model.latent_dim)})

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        d = self.model.latent_dim
        shapes = {k: v for k, v in cs_init(torch.Generator().manual_seed(0), d).items()}
        return {**super().client_init(client_id, gen), CONTEXT: torch.rand(d, generator=gen),
                **kept_optimizer_state(self.train, shapes)}

    def _objective(self, bc: Broadcast, data: ClientData, states: ClientState) -> StackObjective:
        return StackObjective(self._loss, {})  # every tensor it reads is the stack's parameters

    def _loss(self, params: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, noise: Noise,
              inputs: Params) -> tuple[torch.Tensor, torch.Tensor]:
        """The cross-entropy of the personal and global heads on the features split by the policy, plus λ · the
        MMD between the features and the received body's, which it descends; the cross-entropy, which it reports."""
        model, lam, tau, names = self.model, self.params.lam, self.params.tau, self.personal_names()
        z = model.features(params, xb, noise)
        ctx = F.normalize(params[CONTEXT], dim=-1)[:, None, :]
        p, g = policy(params, z * ctx, noise.uniforms(z.shape[1], 2 * z.shape[2]), tau)
        global_head = {**params, **{k: params[HEAD_G + k] for k in names}}
        out = model.head(params, z * p) + model.head(global_head, z * g)
        ce = client_mean(row_cross_entropy(out, yb), mask)
        if not lam:
            return ce, ce
        with torch.no_grad():
            z_base = model.features({**params, **{k: params[BASE + k] for k in self._body}}, xb, None)
        return ce + lam * mmd(z, z_base, mask), ce

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        local, kept_opt = split_state(states)
        received = bc.stacked(n)
        names = self.personal_names()
        frozen = {BASE + k: received[k] for k in self._body}
        trainable = [*self._body, *[k for k in received if k.startswith(CS)], *names]
        params, opt_state, loss = train_clients(self, {**received, **local, **frozen}, kept_opt, data, bc.lr,
                                                objective=self._objective(bc, data, states), trainable=trainable)
        sent = {k: params[k] for k in bc.params}
        for k in names:  # its global head: the mean of its own and the one it received (generate_upload_head)
            sent[HEAD_G + k] = 0.5 * params[k] + 0.5 * received[HEAD_G + k]
        upload = Upload(list(data.client_ids), sent, data.sizes(loss.device), {"train_loss": loss})
        kept = {k: params[k] for k in local if k != CONTEXT}
        ctx = context_of({k: params[k] for k in names}, names, self.model.latent_dim).to(local[CONTEXT])
        return upload, {**kept, CONTEXT: ctx, **opt_state}

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """``head_p(z ⊙ p) + head_g(z ⊙ g)`` with the received body, CS and global head, its own head and
        context."""
        local, _ = split_state(states)
        return Predictor(self.selected, {**bc.stacked(n), **local}, True)


register(AlgorithmSpec(
    "fedcp", FedCP, "a conditional policy splits each sample's features between the client's own head and a "
                    "global head",
    "Zhang et al. 2023, FedCP: Separating Feature Information for Personalized Federated Learning via "
    "Conditional Policy", FedCPParams,
    Capabilities(uploads="shared parameters of the body, the conditional selection module and a global head "
                         "(half its own head), sample count, training loss", personalises=True, stacks_runs=True,
                 whole_model=False, compact_steps=True),
    privacy=(
        PrivacyRow(
            method="FedCP",
            config="`algorithm: fedcp`",
            params="the body, the conditional selection module, and a global head that is half its own head",
            extra="`train_loss`",
            stays="data; its own head (half of it reaches the server) and its context; optimiser state when kept",
        ),
    ),
    family="personalised", venue="KDD 2023",
))
