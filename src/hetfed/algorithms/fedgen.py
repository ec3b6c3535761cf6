"""FedGen (Zhu, Hong, Zhou 2021, "Data-free knowledge distillation for heterogeneous federated learning").

Models are split into a feature extractor and a classifier head (declared by the
model: ``Model.features``, ``Model.head``, ``Model.head_names``). Per round:

1. the server broadcasts the global model, a *generator* ``G_w(ε, y) → z`` of latent
   features conditioned on the label, and the label prior ``p̂(y)``;
2. each client trains on ``CE(local data) + α_r · E_{y∼p̂, ε}[CE(h_θ(G_w(ε, y)), y)]``
   — its head is regularised with generated features (the paper's eq. 6),
   α_r = ``fedgen.alpha`` · ``fedgen.alpha_decay``^round; the client draws
   ``fedgen.client_samples`` (ε, y) pairs per round from its own stream;
3. clients upload their model and their **label counts** (``Upload.extra["label_counts"]``);
4. the server averages the models and trains the generator against the ensemble
   of the clients' heads, each weighted per label by its share of that label
   (``α_{k,y} = n_{k,y} / Σ_j n_{j,y}``, the paper's eq. 4), plus the diversity
   term of the authors' code (``exp(−mean(d(ε_i, ε_j) · d(z_i, z_j)))``, weight
   ``fedgen.diversity``): ``fedgen.server_steps`` Adam steps (lr ``fedgen.lr``) of
   ``fedgen.batch_size`` labels drawn from p̂.

Choices (options): the generator is an MLP ``[ε; onehot(y)] → hidden → z`` without
the authors' batch norm; round 0 has no trained generator yet, so its clients
train as FedAvg's; each client uses one set of generated samples for the whole
round (so a client's numbers do not depend on which clients share its stack).
Every update of a round is needed at once (the heads' ensemble), so they are held.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F
from pydantic import Field

from hetfed.algorithms.fedavg import FedAvg
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.local import StackObjective, cross_entropy, row_cross_entropy
from hetfed.engine.rng import derive_seed
from hetfed.engine.types import (
    Broadcast,
    ClientData,
    ClientState,
    Params,
    ServerState,
    Upload,
    stack_states,
    unstack_state,
)
from hetfed.errors import ConfigError
from hetfed.interface import chain_aggregates
from hetfed.models.base import Model, Noise
from hetfed.models.mlp import MLP

GENERATE = 42  # rng purpose: the server's generator training


class FedGenParams(AlgorithmParams):
    """FedGen's generator and regulariser (Zhu et al. 2021; defaults from the authors' code where the paper is
    silent)."""

    noise_dim: int = Field(32, ge=1, description="ε's size")
    hidden: list[int] = Field(default_factory=lambda: [256], description="the generator MLP's hidden widths")
    lr: float = Field(3e-4, gt=0, description="the generator's Adam learning rate")
    server_steps: int = Field(100, ge=0, description="generator steps per round")
    batch_size: int = Field(64, ge=2, description="labels drawn per generator step")
    diversity: float = Field(1.0, ge=0, description="weight of the diversity term")
    alpha: float = Field(1.0, ge=0, description="weight of the clients' generated-feature loss")
    alpha_decay: float = Field(0.98, gt=0, le=1, description="α multiplied by this every round")
    client_samples: int = Field(64, ge=1, description="(ε, y) pairs each client draws per round")


class Generator:
    """``G_w(ε, y) = MLP([ε; onehot(y)])``: latent features for a label."""

    def __init__(self, noise_dim: int, n_classes: int, hidden: list[int], latent_dim: int):
        self.noise_dim, self.n_classes = noise_dim, n_classes
        self.net = MLP(noise_dim + n_classes, hidden, latent_dim)

    def init(self, gen: torch.Generator) -> Params:
        return self.net.init_shared(gen)

    def __call__(self, params: Params, eps: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``eps`` [n, b, noise], ``y`` [n, b] → z [n, b, latent]; ``params`` stacked [n, …]."""
        h = torch.cat([eps, F.one_hot(y, self.n_classes).to(eps.dtype)], -1)
        return self.net.forward(params, h, None)


def generator_loss(model: Model, heads: Params, z: torch.Tensor, y: torch.Tensor,
                   weights: torch.Tensor) -> torch.Tensor:
    """The paper's eq. 4 for each of R runs: ``mean_b Σ_k α_{k,y_b} · CE(h_k(z_b), y_b)``; ``heads`` stacked over
    R·K clients (run by run), ``z`` [R, b, latent], ``y`` [R, b], ``weights`` [R, K, C] = α_{k,y} → [R]."""
    runs, k = weights.shape[:2]
    logits = model.head(heads, z.unsqueeze(1).expand(runs, k, *z.shape[1:]).flatten(0, 1))  # [R·K, b, C]
    ce = row_cross_entropy(logits, y.repeat_interleave(k, 0)).view(runs, k, -1)  # [R, K, b]
    alpha = weights.gather(2, y.unsqueeze(1).expand(runs, k, y.shape[1]))  # α_{k,y_b}
    return (alpha * ce).sum(1).mean(1)


def diversity_loss(eps: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """The authors' diversity term for each of R runs: ``exp(−mean_ij(d_ε(i, j) · d_z(i, j)))``, d = mean squared
    difference; ``eps`` [R, b, noise], ``z`` [R, b, latent] → [R]."""
    d_eps = (eps.unsqueeze(1) - eps.unsqueeze(2)).pow(2).mean(-1)
    d_z = (z.unsqueeze(1) - z.unsqueeze(2)).pow(2).mean(-1)
    return torch.exp(-(d_eps * d_z).mean((1, 2)))


def train_generators(algos: Sequence[FedGen], starts: Sequence[Params], uploads: Sequence[Upload],
                     counts: Sequence[torch.Tensor], rounds: Sequence[int]) -> list[tuple[Params, list[float]]]:
    """R runs' server step 4 at once: each run's generator from ``starts`` trained against its clients' heads
    (``uploads``, label ``counts`` [K, C]) for ``server_steps`` Adam steps, the R generators stacked along a run
    axis — one forward, backward and update a step for all runs, not one a run. Each run draws its labels and noise
    from its own stream (its seed and round), and the runs' losses are summed, so each gets the gradient and the
    steps it would get alone. Returns each run's trained generator and its losses, step by step."""
    algo = algos[0]
    cfg, model, head = algo.cfg, algo.model, algo.model.head_names or ()
    device = next(iter(starts[0].values())).device
    heads, weights, draws = [], [], []
    for a, upload, c, rnd in zip(algos, uploads, counts, rounds, strict=True):
        k = len(upload.client_ids)
        unseen = {n: v.to(device).unsqueeze(0).expand(k, *v.shape)
                  for n, v in model.local_for_unseen_client().items() if n in head}
        heads.append({**{n: upload.params[n].to(device) for n in head if n in upload.params}, **unseen})
        per_label = c.sum(0)
        weights.append((c / per_label.clamp(min=1)).float().to(device))  # α_{k,y}
        prior = (per_label / per_label.sum()).float().cpu()  # drawn from on the host: the same draws on any device
        gen = torch.Generator().manual_seed(derive_seed(a._seed, GENERATE, rnd))
        steps = [(torch.multinomial(prior, cfg.batch_size, replacement=True, generator=gen),
                  torch.randn((cfg.batch_size, cfg.noise_dim), generator=gen)) for _ in range(cfg.server_steps)]
        draws.append(steps)
    joined = {n: torch.cat([h[n] for h in heads]) for n in heads[0]}
    alphas = torch.stack(weights)
    params = {n: v.detach().requires_grad_(True) for n, v in stack_states(list(starts)).items()}
    opt = torch.optim.Adam(params.values(), lr=cfg.lr)
    losses = []
    for step in range(cfg.server_steps):
        y = torch.stack([d[step][0] for d in draws]).to(device)
        eps = torch.stack([d[step][1] for d in draws]).to(device)
        z = algo.generator(params, eps, y)
        loss = generator_loss(model, joined, z, y, alphas) + cfg.diversity * diversity_loss(eps, z)
        opt.zero_grad()
        loss.sum().backward()
        opt.step()
        losses.append(loss.detach())
    per_run = torch.stack(losses).T.tolist() if losses else [[] for _ in algos]
    return list(zip(unstack_state(params, len(algos)), per_run, strict=True))


class FedGen(FedAvg):
    """FedAvg + a server-trained generator that regularises clients' heads (see the module docstring)."""

    def __init__(self, model: Model, train, params: FedGenParams | None = None, context=None):
        super().__init__(model, train, params, context)
        if model.head_names is None:
            raise ConfigError(f"algorithm 'fedgen' needs a model split into features and a head, but "
                              f"{type(model).__name__} declares none; expected model.kind mlp, cnn, cgau or logreg")
        self.cfg = self.params
        self.generator = Generator(self.cfg.noise_dim, model.n_classes, list(self.cfg.hidden), model.latent_dim)

    # -- server
    def server_init(self, gen: torch.Generator) -> ServerState:
        state = super().server_init(gen)
        prior = torch.full((self.model.n_classes,), 1.0 / self.model.n_classes)
        return ServerState(state.params, state.round, {**state.extra, "generator": self.generator.init(gen),
                                                       "label_prior": prior, "trained": False})

    def broadcast(self, state: ServerState, round: int) -> Broadcast:
        bc = super().broadcast(state, round)
        alpha = self.cfg.alpha * self.cfg.alpha_decay**round if state.extra.get("trained") else 0.0
        return Broadcast(bc.params, bc.round, bc.lr, {**bc.extra, "generator": state.extra["generator"],
                                                      "label_prior": state.extra["label_prior"], "alpha": alpha})

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        return self.aggregate_runs([self], [state], [upload])[0]

    def aggregate_key(self, state: ServerState, upload: Upload) -> tuple:
        """Runs (of the same parameters and model) train their generators in one stack when they hold them on one
        device and as many clients' heads answered (a sweep's seeds), their server chains one computation."""
        return (self.context.pipeline.identity, str(next(iter(state.extra["generator"].values())).device),
                len(upload.client_ids))

    @classmethod
    def aggregate_runs(cls, algos, states, uploads) -> list[ServerState]:
        """The runs' FedAvg steps (their server chains in one call), then every run's generator trained against
        its clients' heads in one stack (:func:`train_generators`): each run's numbers as alone."""
        averaged = chain_aggregates(algos, states, uploads)
        counts = [u.extra["label_counts"].double() for u in uploads]
        trained = train_generators(algos, [s.extra["generator"] for s in states], uploads, counts,
                                   [s.round for s in states])
        return [ServerState(a.params, a.round, {**a.extra, "generator": generator, "trained": True,
                                                "label_prior": (c.sum(0) / c.sum()).float(), "generator_loss": losses})
                for a, c, (generator, losses) in zip(averaged, counts, trained, strict=True)]

    # -- client
    def _generated(self, bc: Broadcast, data: ClientData) -> tuple[torch.Tensor, torch.Tensor]:
        """Each client's (z, y) for the round, from its own stream and its own run's generator and label prior (a
        stacked sweep's clients come from several runs): [n, S, latent], [n, S]."""
        cfg, device = self.cfg, data.x.device
        zs, ys = [], []
        n = len(data.client_ids)
        generators = {k: v.to(device) for k, v in bc.extra_rows("generator", n).items()}  # the server's, host-kept
        priors = bc.extra_rows("label_prior", n).float().cpu()
        for i, seed in enumerate(data.seeds):
            g = torch.Generator().manual_seed(int(seed) ^ 0xFE06E)
            y = torch.multinomial(priors[i], cfg.client_samples, replacement=True, generator=g)
            eps = torch.randn((cfg.client_samples, cfg.noise_dim), generator=g)
            with torch.no_grad():
                zs.append(self.generator({k: v[i : i + 1] for k, v in generators.items()},
                                         eps.unsqueeze(0).to(device), y.unsqueeze(0).to(device))[0])
            ys.append(y.to(device))
        return torch.stack(zs), torch.stack(ys)

    def _objective(self, bc: Broadcast, data: ClientData, states: ClientState) -> StackObjective | None:
        """The cross-entropy plus α_r · CE(h_θ(z), y) per client on its generated (z, y): only the head sees it."""
        alpha = float(bc.extra.get("alpha", 0.0))
        if alpha <= 0:
            return None
        z, y = self._generated(bc, data)
        alpha_rows = torch.full((len(z),), alpha, dtype=z.dtype, device=z.device)
        return StackObjective(self._teacher_loss, {"z": z, "y": y, "alpha": alpha_rows})

    def _teacher_loss(self, params: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, noise: Noise,
                      inputs: Params) -> tuple[torch.Tensor, torch.Tensor]:
        """Each client's cross-entropy plus its generator's teaching term (reported: the cross-entropy)."""
        ce = cross_entropy(self.model, params, xb, yb, mask, noise)
        teacher = row_cross_entropy(self.model.head(params, inputs["z"]), inputs["y"])
        return ce + inputs["alpha"] * teacher.view(len(teacher), -1).mean(1), ce

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        upload, new = super().local_update(bc, states, data)
        counts = data.label_counts(self.model.n_classes)
        return replace(upload, extra={**upload.extra, "label_counts": counts.to(upload.num_samples.device)}), new


register(AlgorithmSpec(
    "fedgen", FedGen, "FedAvg plus a server-trained generator of latent features that regularises the clients' heads",
    "Zhu et al. 2021, Data-Free Knowledge Distillation for Heterogeneous Federated Learning", FedGenParams,
    Capabilities(uploads="shared parameters, sample count, training loss, per-class label counts",
                 whole_round=True, stacks_runs=True, compact_steps=True),
    legacy_section="fedgen", quick={"server_steps": 5},
    privacy=(
        PrivacyRow(
            method="FedGen",
            config="`algorithm: fedgen`",
            params="shared model parameters (held together: the server ensembles the heads)",
            extra="`train_loss`; **`label_counts`: how many training samples of each class the client holds**",
            stays="data; optimiser state when kept",
        ),
    ),
    family="heterogeneity-specific", venue="ICML 2021",
))
