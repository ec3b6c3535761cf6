"""Fed-FSNet (Guo et al., "Mitigating Non-I.I.D. Federated Learning via Fuzzy Synthesizing Network").

Per round, on top of FedAvg:

1. every sampled client uploads, besides its shared parameters and sample count,
   the per-feature mean μ_k and variance σ²_k of its training inputs
   (``Upload.extra["input_mean"]``, ``["input_var"]``) — extra information that
   leaves the client (see the privacy notes in docs/methods.md);
2. the server aggregates θ_g as FedAvg does;
3. the server trains a *hidden model* H_ω (an MLP decoder from the class
   probability simplex back to the input space) so that ``‖H_ω(P_θg(z)) − z‖₂``
   is small for z drawn from the Gaussian mixture ``Σ_k π_k N(μ_k, diag σ²_k)``,
   π_k ∝ the uploading clients' sample counts, θ_g frozen (paper eq. 3);
4. the server synthesises D′ (``fsnet.n_synthetic``, 60 in the paper) by feeding
   H_ω near-one-hot probability vectors that cover the classes evenly (eq. 9);
5. D′ travels in the next round's Broadcast; each client trains on
   ``CE(local data) + β·KL(U ‖ P_θ(y | x′))`` averaged over x′ ∈ D′ (eq. 10),
   with β = ``beta0 · beta_decay^⌊round / beta_every⌋`` (1, ÷10 every 10 rounds).

Decisions where the paper is vague (all its ``params``):

- H_ω is warm-started from the previous round (it persists in the server state)
  and trained for ``server_steps`` Adam steps of ``server_batch`` mixture samples;
- near-one-hot vectors: the target class gets ``1 − Σ ε_j``, every other class
  ``ε_j ~ U(0, epsilon)``, so rows sum to 1 and ``C_i ≫ ε``;
- the KL term is computed without dropout on D′ and is zero until a D′ exists
  (round 0 is plain FedAvg);
- μ/σ² are computed on the client's training inputs in the model's input space
  (after any embedding).
"""

from __future__ import annotations

import math
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
from hetfed.config import TrainConfig
from hetfed.engine.local import StackObjective, cross_entropy
from hetfed.engine.types import (
    Broadcast,
    ClientData,
    ClientState,
    Params,
    ServerState,
    Upload,
    index_on,
    stack_states,
    unstack_state,
)
from hetfed.interface import chain_aggregates
from hetfed.models.base import Model, Noise
from hetfed.models.mlp import MLP


class FSNetParams(AlgorithmParams):
    """Fed-FSNet's server-side synthesis (see hetfed.algorithms.fsnet for the decisions)."""

    n_synthetic: int = Field(60, ge=1, description="size of the synthetic set D′")
    hidden: list[int] = Field(default_factory=lambda: [256, 256], description="hidden model H_ω widths")
    server_steps: int = Field(100, ge=0, description="Adam steps on H_ω per round")
    server_batch: int = Field(256, ge=1, description="mixture samples per step")
    server_lr: float = Field(1e-3, gt=0)
    epsilon: float = Field(0.01, ge=0, lt=1, description="off-class mass per class in near-one-hot inputs")
    beta0: float = Field(1.0, ge=0, description="β at round 0")
    beta_decay: float = Field(0.1, ge=0, le=1, description="β multiplied by this every beta_every rounds")
    beta_every: int = Field(10, ge=1)


def beta_schedule(cfg: FSNetParams, round: int) -> float:
    """β for a round: beta0, multiplied by beta_decay every beta_every rounds."""
    return cfg.beta0 * cfg.beta_decay ** (round // cfg.beta_every)


def sample_mixture(means: torch.Tensor, variances: torch.Tensor, weights: torch.Tensor, n: int,
                   gen: torch.Generator) -> torch.Tensor:
    """n draws from ``Σ_k π_k N(μ_k, diag σ²_k)`` (π = weights / Σ weights)."""
    comp, noise = mixture_draws(weights, n, means.shape[1], 1, gen)
    return _from_draws(means, variances, comp[0].to(means.device), noise[0].to(means.device))


def mixture_draws(weights: torch.Tensor, n: int, d: int, steps: int,
                  gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The host generator's draws for ``steps`` calls of :func:`sample_mixture`, in its order (a component index
    per sample, then d standard normals per sample, step after step): [steps, n] and [steps, n, d] on the CPU."""
    pi = (weights / weights.sum()).cpu()
    comps, noises = [], []
    for _ in range(steps):
        comps.append(torch.multinomial(pi, n, replacement=True, generator=gen))
        noises.append(torch.randn((n, d), generator=gen))
    return torch.stack(comps), torch.stack(noises)


def _from_draws(means: torch.Tensor, variances: torch.Tensor, comp: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
                noise: torch.Tensor) -> torch.Tensor:
    """The mixture's samples from its draws: ``comp`` indexes the components' rows (``(runs, comp)`` for runs'
    mixtures stacked [R, K, d])."""
    return means[comp] + variances[comp].clamp_min(0).sqrt() * noise


#: server steps whose mixture draws are made on the host and moved to the device at once (a copy from the host
#: waits for the device's queue: one per step made the hidden model's fit host-bound on a GPU)
DRAW_CHUNK = 10


def near_one_hot(n: int, n_classes: int, epsilon: float, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n probability rows covering the classes evenly; class i gets 1 − Σ ε, others ε ~ U(0, epsilon)."""
    labels = torch.arange(n) % n_classes
    eps = torch.rand((n, n_classes), generator=gen) * epsilon
    eps[torch.arange(n), labels] = 0
    probs = eps.clone()
    probs[torch.arange(n), labels] = 1 - eps.sum(1)
    return probs, labels


def kl_uniform(logits: torch.Tensor) -> torch.Tensor:
    """KL(U ‖ softmax(logits)) averaged over samples; ``logits`` [n, m, C] → [n]."""
    c = logits.shape[-1]
    logp = F.log_softmax(logits, -1)
    return (-math.log(c) - logp.mean(-1)).mean(-1)


def train_hidden(algos, global_params: list[Params], hidden_params: list[Params], uploads: list[Upload],
                 gens: list[torch.Generator]) -> list[tuple[Params, list[float]]]:
    """Fit each of R runs' H_ω so that H_ω(P_θg(z)) ≈ z for z from its clients' Gaussian mixture (θ_g frozen), the R
    hidden models stacked along a run axis: one forward, backward and Adam step a server step for all runs. Each run
    draws from its own stream (``gens``) and the runs' losses are summed, so each gets the steps it would get alone.
    Returns each run's fitted H_ω and its losses, step by step."""
    algo = algos[0]
    cfg = algo.cfg
    device = next(iter(global_params[0].values())).device
    g = stack_states(global_params)
    params = {k: v.detach().to(device).requires_grad_(True) for k, v in stack_states(hidden_params).items()}
    opt = torch.optim.Adam(params.values(), lr=cfg.server_lr)
    means = torch.stack([u.extra["input_mean"] for u in uploads])  # [R, K, d]
    variances = torch.stack([u.extra["input_var"] for u in uploads])
    rows = torch.arange(len(algos), device=device).unsqueeze(1)
    losses = []  # kept on the device and read once after the loop: a read per step would wait for the device
    for start in range(0, cfg.server_steps, DRAW_CHUNK):
        steps = min(DRAW_CHUNK, cfg.server_steps - start)
        draws = [mixture_draws(u.num_samples, cfg.server_batch, means.shape[-1], steps, gen)
                 for u, gen in zip(uploads, gens, strict=True)]
        comps, noises = (torch.stack(t, 1).to(device) for t in zip(*draws, strict=True))  # [steps, R, …]
        for comp, noise in zip(comps, noises, strict=True):
            z = _from_draws(means, variances, (rows, comp), noise)  # [R, n, d]
            with torch.no_grad():
                probs = torch.softmax(algo.model.forward(g, z, None), -1)
            recon = algo.hidden.forward(params, probs, None)
            loss = (recon - z).pow(2).sum(-1).mean(-1)
            opt.zero_grad()
            loss.sum().backward()
            opt.step()
            losses.append(loss.detach())
    per_run = torch.stack(losses).T.tolist() if losses else [[] for _ in algos]
    return list(zip(unstack_state(params, len(algos)), per_run, strict=True))


class FedFSNet(FedAvg):
    """FedAvg + server-side fuzzy synthesis of near-IID samples (see module docstring)."""

    def __init__(self, model: Model, train: TrainConfig, params: FSNetParams | None = None, context=None):
        super().__init__(model, train, params, context)
        if self.context.in_features is None:
            raise ValueError("fsnet needs context.in_features (the input size the hidden model decodes to)")
        self.cfg = self.params
        self.hidden = MLP(model.n_classes, self.cfg.hidden, self.context.in_features)

    # -- server
    def server_init(self, gen: torch.Generator) -> ServerState:
        state = super().server_init(gen)
        seed = int(torch.randint(0, 2**62, (1,), generator=gen))
        return ServerState(state.params, 0, {"seed": seed, "hidden": self.hidden.init_shared(gen), "synthetic": None,
                                             "hidden_loss": []})

    def broadcast(self, state: ServerState, round: int) -> Broadcast:
        bc = super().broadcast(state, round)
        synthetic = state.extra.get("synthetic")  # none before the first round's aggregation
        return Broadcast(bc.params, round, bc.lr, {**({} if synthetic is None else {"synthetic": synthetic}),
                                                   "beta": beta_schedule(self.cfg, round)})

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        return self.aggregate_runs([self], [state], [upload])[0]

    def aggregate_key(self, state: ServerState, upload: Upload) -> tuple:
        """Runs (of the same parameters and model) fit their hidden models in one stack when their models and
        mixtures are on one device and as many clients answered (a sweep's seeds), their server chains one
        computation."""
        means = upload.extra["input_mean"]
        return (self.context.pipeline.identity, str(next(iter(state.params.values())).device),
                str(means.device), tuple(means.shape))

    @classmethod
    def aggregate_runs(cls, algos, states, uploads) -> list[ServerState]:
        """The runs' FedAvg steps (their server chains in one call), then every run's hidden model fitted in one
        stack (:func:`train_hidden`) and its D′ synthesised: each run's numbers as alone."""
        new = chain_aggregates(algos, states, uploads)
        gens = [torch.Generator().manual_seed(s.extra["seed"] + s.round) for s in states]
        fitted = train_hidden(algos, [n.params for n in new], [s.extra["hidden"] for s in states], uploads, gens)
        return [ServerState(n.params, n.round, {**s.extra, "hidden": hidden, "synthetic": a.synthesise(hidden, gen),
                                                "hidden_loss": losses})
                for a, s, n, gen, (hidden, losses) in zip(algos, states, new, gens, fitted, strict=True)]

    def synthesise(self, hidden_params, gen: torch.Generator) -> torch.Tensor:
        """D′: H_ω of near-one-hot probability vectors, classes covered evenly."""
        device = next(iter(hidden_params.values())).device
        probs, _ = near_one_hot(self.cfg.n_synthetic, self.model.n_classes, self.cfg.epsilon, gen)
        with torch.no_grad():
            h = {k: v.unsqueeze(0) for k, v in hidden_params.items()}
            return self.hidden.forward(h, probs.to(device).unsqueeze(0), None)[0]

    # -- client
    def _objective(self, bc: Broadcast, data: ClientData, states: ClientState) -> StackObjective | None:
        """The cross-entropy plus β·KL(uniform ‖ f(D′)) once a D′ exists (each client its own run's D′ and β)."""
        beta = bc.extra.get("beta", 0.0)
        if not bc.has_extra("synthetic") or beta == 0:
            return None
        n = len(data.client_ids)
        synthetic = bc.extra_rows("synthetic", n)
        beta_rows = torch.full((n,), float(beta), dtype=synthetic.dtype, device=synthetic.device)
        return StackObjective(self._kl_loss, {"synthetic": synthetic, "beta": beta_rows})

    def _kl_loss(self, params: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, noise: Noise,
                 inputs: Params) -> tuple[torch.Tensor, torch.Tensor]:
        """Each client's cross-entropy plus its KL term (reported: the cross-entropy)."""
        ce = cross_entropy(self.model, params, xb, yb, mask, noise)
        return ce + inputs["beta"] * kl_uniform(self.model.forward(params, inputs["synthetic"], None)), ce

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        upload, new_states = super().local_update(bc, states, data)
        means, variances = [], []
        for idx in data.indices:
            xk = data.x[index_on(idx, data.x.device)]
            means.append(xk.mean(0))
            variances.append(xk.var(0, unbiased=False) if len(idx) > 1 else torch.zeros_like(xk[0]))
        extra = {**upload.extra, "input_mean": torch.stack(means), "input_var": torch.stack(variances)}
        return replace(upload, extra=extra), new_states


register(AlgorithmSpec(
    "fsnet", FedFSNet, "FedAvg whose server synthesises near-IID samples that regularise the clients with a KL term",
    "Guo et al., Mitigating Non-I.I.D. Federated Learning via Fuzzy Synthesizing Network", FSNetParams,
    Capabilities(uploads="shared parameters, sample count, training loss, per-feature mean and variance of the "
                 "client's inputs", whole_round=False,
                 model_kinds=("mlp", "cnn", "cnn4", "logreg", "cgau"),
                 model_reason="its server synthesises continuous inputs, not token ids", stacks_runs=True,
                 compact_steps=True),
    legacy_section="fsnet", quick={"server_steps": 5},
    privacy=(
        PrivacyRow(
            method="Fed-FSNet",
            config="`algorithm: fsnet`",
            params="shared model parameters",
            extra="`train_loss`; **`input_mean`, `input_var`: per-feature mean and variance of the client's training "
                  "inputs**",
            stays="data",
        ),
    ),
    family="heterogeneity-specific", venue="arXiv 2022",
))
