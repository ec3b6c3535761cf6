"""GPFL (Zhang, Hua, Wang, Song, Xue, Ma, Guan 2023, "GPFL: Simultaneously Learning Global and Personalized
Feature Information for Personalized Federated Learning", ICCV), as PFLlib's ``clientgpfl`` / ``servergpfl``.

Besides the body (feature extractor) and each client's own head, two shared modules:

- **Global category embedding (GCE)**: an embedding e_c per class (``gpfl.gce``, [C, d]), trained with an
  angle-level softmax ``−log softmax_c cos(z, e_c)`` on the features;
- **Conditional valve (CoV)**: from a conditional input c, ``γ = LayerNorm(ReLU(W_γ c + b_γ))`` and
  ``β = LayerNorm(ReLU(W_β c + b_β))`` turn a feature z into ``ReLU(z ⊙ (γ + 1) + β)``.

Each client has two conditional inputs from the GCE's embeddings: the generic ``g = (1/C)·Σ_c e_c`` and its
personal ``p = Σ_c π_c e_c`` (π its class distribution). Its head reads ``z_P = CoV(z, p)``; the GCE reads
``z_G = CoV(z, g)``. The training loss is

    CE(head(z_P), y) + angle-softmax(z_G, y) + λ·‖z_G − ē_y‖₂ + μ/2·‖(GCE, CoV)‖²,

ē the received GCE frozen for the round, the norm over the batch (PFLlib's ``torch.norm(feat_G − emb, 2)``: not
squared, not averaged), μ the GCE's and CoV's weight decay (PFLlib's separate SGD optimisers with
``weight_decay=μ``; here their gradient term, the same step for SGD). Defaults λ = 1.0 and μ = 0.0 are PFLlib's
command-line defaults (``--lamda``, ``--mu``). The server averages body, GCE and CoV (FedAvg, through the server
pipeline); heads stay on the clients. A client predicts with ``head(CoV(z, p))``.

Difference from PFLlib: the conditional inputs come from the GCE the client receives each round (PFLlib computes
them, once a round has ended, from the client's own GCE before overwriting it with the new global one); before
its first round a client's π is unknown and p is 0, as PFLlib's initial conditional inputs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from pydantic import Field

from hetfed.algorithms._personal import PartlyPersonal, head_of
from hetfed.algorithms.fedavg import kept_optimizer_state
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
from hetfed.models.base import Derived, Model, Noise, linear_init

GCE = "gpfl.gce"
#: the CoV's parameters: ``gpfl.cov.<gamma|beta>.<weight|bias|norm_weight|norm_bias>``
COV = "gpfl.cov."
#: the client's class distribution π in its state (set at its first round)
PRIOR = "gpfl.prior"


class GPFLParams(AlgorithmParams):
    lam: float = Field(1.0, ge=0, description="λ, the weight of ‖z_G − ē_y‖ (PFLlib's --lamda default)")
    mu: float = Field(0.0, ge=0, description="μ, the GCE's and CoV's weight decay (PFLlib's --mu default)")


def extra_shapes(n_classes: int, d: int) -> dict[str, tuple[int, ...]]:
    """GPFL's shared modules: the GCE and the two branches of the CoV."""
    shapes: dict[str, tuple[int, ...]] = {GCE: (n_classes, d)}
    for branch in ("gamma", "beta"):
        shapes.update({f"{COV}{branch}.weight": (d, d), f"{COV}{branch}.bias": (d,),
                       f"{COV}{branch}.norm_weight": (d,), f"{COV}{branch}.norm_bias": (d,)})
    return shapes


def init_extra(gen: torch.Generator, n_classes: int, d: int) -> Params:
    """``nn.Embedding`` (N(0, 1)) and ``nn.Linear`` / ``nn.LayerNorm`` initialisation, from ``gen``."""
    out = {GCE: torch.randn(n_classes, d, generator=gen)}
    for branch in ("gamma", "beta"):
        out[f"{COV}{branch}.weight"], out[f"{COV}{branch}.bias"] = linear_init(gen, d, d)
        out[f"{COV}{branch}.norm_weight"] = torch.ones(d)
        out[f"{COV}{branch}.norm_bias"] = torch.zeros(d)
    return out


def valve(params: Params, z: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
    """CoV: ``ReLU(z ⊙ (γ(c) + 1) + β(c))`` for stacked features ``z`` [n, b, d] and one context per client [n, d]."""
    def branch(name: str) -> torch.Tensor:
        h = torch.relu(torch.einsum("ni,noi->no", context, params[f"{COV}{name}.weight"])
                       + params[f"{COV}{name}.bias"])
        h = F.layer_norm(h, h.shape[-1:])
        return h * params[f"{COV}{name}.norm_weight"] + params[f"{COV}{name}.norm_bias"]

    return torch.relu(z * (branch("gamma")[:, None, :] + 1) + branch("beta")[:, None, :])


def angle_softmax(z: torch.Tensor, embeddings: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each row's ``−log softmax_c cos(z, e_c)`` [n, b] (GCE's loss; ``embeddings`` [n, C, d])."""
    cosine = torch.einsum("nbd,ncd->nbc", F.normalize(z, dim=-1), F.normalize(embeddings, dim=-1))
    return -torch.gather(F.log_softmax(cosine, dim=-1), -1, y[..., None]).squeeze(-1)


def conditional_inputs(embeddings: torch.Tensor, prior: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(generic ``(1/C)·Σ_c e_c``, personal ``Σ_c π_c e_c``) per client [n, d] (``embeddings`` [n, C, d])."""
    return embeddings.mean(1), torch.einsum("nc,ncd->nd", prior.to(embeddings), embeddings)


class Valved(Derived):
    """The client's prediction: ``head(CoV(z, p))``."""

    def __init__(self, base: Model):
        super().__init__(base)

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        _, personal = conditional_inputs(params[GCE], params[PRIOR])
        return self.base.head(params, valve(params, self.base.features(params, x, noise), personal))


class GPFL(PartlyPersonal):
    """Shared body, GCE and CoV; personal heads reading features through the client's conditional valve."""

    def __init__(self, model, train, params=None, context=None):
        super().__init__(model, train, params, context)
        self.valved = Valved(model)
        self._decayed = tuple(extra_shapes(model.n_classes, model.latent_dim))  # μ's parameters: the GCE and CoV

    def personal_names(self) -> tuple[str, ...]:
        return head_of(self.model, self.spec.name)

    def server_init(self, gen: torch.Generator) -> ServerState:
        state = super().server_init(gen)
        return ServerState({**state.params, **init_extra(gen, self.model.n_classes, self.model.latent_dim)})

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        shapes = extra_shapes(self.model.n_classes, self.model.latent_dim)
        return {**super().client_init(client_id, gen), PRIOR: torch.zeros(self.model.n_classes),
                **kept_optimizer_state(self.train, {k: torch.zeros(s) for k, s in shapes.items()})}

    def _objective(self, bc: Broadcast, data: ClientData, states: ClientState) -> StackObjective:
        frozen = bc.stacked(len(data.client_ids))[GCE].detach()
        generic, personal = conditional_inputs(frozen, self._prior(data))
        return StackObjective(self._loss, {"frozen": frozen, "generic": generic, "personal": personal})

    def _loss(self, params: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, noise: Noise,
              inputs: Params) -> tuple[torch.Tensor, torch.Tensor]:
        """The personal head's cross-entropy, GCE's angle softmax and λ · the generic features' distance to their
        class's received embedding (``inputs``: that embedding and the conditional inputs, each client's own), plus
        μ/2 · the decayed parameters' squares, which it descends; the cross-entropy, which it reports."""
        model, lam, mu, frozen = self.model, self.params.lam, self.params.mu, inputs["frozen"]
        y = yb.long()
        z = model.features(params, xb, noise)
        ce = client_mean(row_cross_entropy(model.head(params, valve(params, z, inputs["personal"])), y), mask)
        z_g = valve(params, z, inputs["generic"])
        gce = client_mean(angle_softmax(z_g, params[GCE], y), mask)
        target = torch.gather(frozen, 1, y[..., None].expand(*y.shape, frozen.shape[-1]))
        # ‖z_G − ē_y‖ over the batch's real rows (vector_norm's gradient at 0 is 0: a client without rows)
        distance = torch.linalg.vector_norm(((z_g - target) * mask[..., None]).flatten(1), dim=1)
        loss = ce + gce + lam * distance
        if mu:
            loss = loss + mu / 2 * sum((params[k] ** 2).flatten(1).sum(1) for k in self._decayed)
        return loss, ce

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        upload, new = super().local_update(bc, {k: v for k, v in states.items() if k != PRIOR}, data)
        return upload, {**new, PRIOR: self._prior(data).to(states[PRIOR])}

    def _prior(self, data: ClientData) -> torch.Tensor:
        """π: each client's share of its training samples per class ``[n, C]`` (zero for a client without any)."""
        prior = data.label_counts(self.model.n_classes)
        return prior / prior.sum(1, keepdim=True).clamp(min=1)

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """``head(CoV(z, p))`` with the received GCE and CoV and the client's head and π."""
        local, _ = split_state(states)
        return Predictor(self.valved, {**bc.stacked(n), **local}, True)


register(AlgorithmSpec(
    "gpfl", GPFL, "shared body, global category embeddings and a conditional valve; each client's head reads its "
                  "features through the valve conditioned on its class distribution",
    "Zhang et al. 2023, GPFL: Simultaneously Learning Global and Personalized Feature Information for "
    "Personalized Federated Learning", GPFLParams,
    Capabilities(uploads="shared parameters of the body, the category embeddings and the conditional valve, "
                         "sample count, training loss", personalises=True, stacks_runs=True, whole_model=False,
                 compact_steps=True),
    privacy=(
        PrivacyRow(
            method="GPFL",
            config="`algorithm: gpfl`",
            params="the body, the global category embeddings and the conditional valve",
            extra="`train_loss`",
            stays="data; its head; its class distribution (`gpfl.prior`); optimiser state when kept",
        ),
    ),
    family="personalised", venue="ICCV 2023",
))
