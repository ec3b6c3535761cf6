"""FedEM (Marfoq, Neglia, Bellet, Kameni, Vidal 2021, "Federated Multi-Task Learning under a Mixture of
Distributions", NeurIPS), as its authors' code (``omarfoq/FedEM``: ``MixtureClient``, ``CentralizedAggregator``).

Each client's data distribution is taken to be a mixture of M shared components; the server keeps one model per
component, θ_1 … θ_M (``params.components``, 3 as the authors' experiments; independent draws), and each client
keeps its own mixture weights π_k (uniform at first, never sent). A round of a client (Algorithm 1):

- **E-step**: with the models it received, every training sample's responsibility
  ``q_i(m) = π_m·exp(−ℓ(θ_m; x_i, y_i)) / Σ_m' π_m'·exp(−ℓ(θ_m'; x_i, y_i))`` (the authors' ``softmax(log π − ℓ)``,
  the losses in evaluation mode), then ``π ← mean_i q_i``;
- **M-step**: local SGD on every component at once, component m on the q-weighted loss
  ``(1/b)·Σ_{i in batch} q_i(m)·ℓ(θ_m; x_i, y_i)`` (the responsibilities are fixed during the round: a batch's are
  recomputed from the received models, which gives the E-step's numbers without a per-sample table).

The server averages each component over the clients weighted by their sample counts (the authors' aggregator:
FedAvg per component, through the server pipeline). A client predicts with its mixture
``p(y | x) = Σ_m π_m·softmax(f(θ_m; x))``; the prediction's "logits" are its log. FedEM has no single global
model: the global test set is scored by each client's mixture (no server-side score).

Differences from the authors' code: the components share one batch sequence per step (the authors iterate each
learner over its own batches of the same data) and one optimiser call (plain SGD: the same step per component).
"""

from __future__ import annotations

import torch
from pydantic import Field

from hetfed.algorithms.fedavg import FedAvg, kept_optimizer_state, train_clients
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.evaluate import Predictor, predict
from hetfed.engine.local import StackObjective, client_mean, row_cross_entropy
from hetfed.engine.types import Broadcast, ClientData, ClientState, ServerState, Upload, index_on, split_state
from hetfed.models.base import Derived, Model, Noise, Params, prefixed, under, without

#: the client's mixture weights π_k in its state (never sent)
WEIGHTS = "fedem.weights"
START = "fedem.start."  # the M-step loss's inputs: the received models and local parameters, under this prefix


class FedEMParams(AlgorithmParams):
    components: int = Field(3, ge=1, description="M, the shared component models (the authors' experiments: 3)")


def key(m: int, name: str) -> str:
    """Component m's parameter ``name`` in the server's parameters: ``fedem.<m>.<name>``."""
    return f"fedem.{m}.{name}"


def _under(noise: Noise | None, m: int) -> Noise | None:
    """Component m's forward's draws and batch-norm statistics (its own, under ``fedem.<m>.``)."""
    return noise.under(key(m, "")) if noise is not None else None


def component(params: Params, m: int, names: list[str]) -> Params:
    """Component m's model (its shared parameters under the base model's names, and every other entry of
    ``params`` — the base's local parameters — as they are)."""
    own = {name: params[key(m, name)] for name in names}
    rest = without(params, "fedem.")
    return {**rest, **own}


def responsibilities(log_weights: torch.Tensor, losses: torch.Tensor) -> torch.Tensor:
    """The E-step: ``q(m) ∝ π_m·exp(−ℓ_m)`` over the last axis (``log_weights`` broadcast against ``losses``)."""
    return torch.softmax(log_weights - losses, dim=-1)


class Mixture(Derived):
    """A client's mixture of the components: ``log Σ_m π_m·softmax(f(θ_m; x))``."""

    def __init__(self, base: Model, components: int):
        super().__init__(base)
        self.components = components
        self.names = [s.name for s in base.specs() if not s.local]

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        weights = params[WEIGHTS]  # [n, M]
        probs = sum(weights[:, m, None, None] * torch.softmax(self.base.forward(component(params, m, self.names),
                                                                                 x, _under(noise, m)), -1)
                    for m in range(self.components))
        return torch.log(torch.as_tensor(probs).clamp_min(torch.finfo(weights.dtype).tiny))


class FedEM(FedAvg):
    """M shared component models; each client learns its mixture weights by EM and trains every component on
    the samples it is responsible for."""

    def __init__(self, model, train, params=None, context=None):
        super().__init__(model, train, params, context)
        self.mixture = Mixture(model, self.params.components)

    def server_init(self, gen: torch.Generator) -> ServerState:
        draws = [self.model.init_shared(gen) for _ in range(self.params.components)]
        return ServerState({key(m, k): v for m, d in enumerate(draws) for k, v in d.items()})

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        m = self.params.components
        trained = {key(j, s.name): torch.zeros(s.shape) for j in range(m) for s in self.model.specs() if not s.local}
        trained.update({s.name: torch.zeros(s.shape) for s in self.model.specs() if s.local})
        return {**self.model.init_local(gen), WEIGHTS: torch.full((m,), 1.0 / m),
                **kept_optimizer_state(self.train, trained)}

    @torch.no_grad()
    def e_step(self, received: Params, local: Params, weights: torch.Tensor, data: ClientData) -> torch.Tensor:
        """Each client's new mixture weights ``mean_i q_i`` [n, M] over its training samples (a client without
        samples keeps its own)."""
        losses = []
        for m in range(self.params.components):
            logits = predict(self.model, component({**received, **local}, m, self.mixture.names), data.x,
                             data.indices)
            losses.append([torch.nn.functional.cross_entropy(z, data.y[index_on(i, data.y.device)],
                                                             reduction="none") if len(i) else z.new_zeros(0)
                           for z, i in zip(logits, data.indices, strict=True)])
        new = weights.clone()
        for k, index in enumerate(data.indices):
            if len(index):
                ell = torch.stack([losses[m][k] for m in range(self.params.components)], dim=1)  # [size, M]
                new[k] = responsibilities(weights[k].log().to(ell.device), ell).mean(0).to(new.device)
        return new

    def m_step(self, received: Params, local: Params, weights: torch.Tensor) -> StackObjective:
        """The round's objective: every component's q-weighted mean loss, q from the received models (its inputs:
        the received models and local parameters, and the mixture weights)."""
        return StackObjective(self._m_loss, {**prefixed({**received, **local}, START),
                                             WEIGHTS: weights.to(next(iter(received.values())).device)})

    def _m_loss(self, params: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, noise: Noise,
                inputs: Params) -> torch.Tensor:
        model, names, m_count = self.model, self.mixture.names, self.params.components
        start = under(inputs, START)
        with torch.no_grad():
            ell = torch.stack([row_cross_entropy(model.forward(component(start, m, names), xb, None), yb)
                               for m in range(m_count)], dim=-1)  # [n, b, M]
            q = responsibilities(inputs[WEIGHTS].log()[:, None, :], ell)
        loss = sum(client_mean(q[..., m] * row_cross_entropy(model.forward(component(params, m, names), xb,
                                                                             _under(noise, m)), yb), mask)
                   for m in range(m_count))
        return torch.as_tensor(loss)

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        local, kept_opt = split_state(states)
        weights = local.pop(WEIGHTS)
        received = bc.stacked(n)
        new_weights = self.e_step(received, local, weights, data)
        params, opt_state, loss = train_clients(self, {**received, **local}, kept_opt, data, bc.lr,
                                                objective=self.m_step(received, local, weights))
        upload = Upload.of(data, params, bc.params, loss)
        return upload, {**{k: params[k] for k in local}, WEIGHTS: new_weights, **opt_state}

    @torch.no_grad()
    def evaluate_server(self, state: ServerState, x_global: torch.Tensor, y_global: torch.Tensor) -> dict[str, float]:
        """No single global model: the global test set is scored by each client's mixture."""
        return {}

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """Each client predicts with its mixture of the components."""
        local, _ = split_state(states)
        return Predictor(self.mixture, {**bc.stacked(n), **local}, True)


register(AlgorithmSpec(
    "fedem", FedEM, "M shared component models; each client fits its mixture weights by EM and predicts with its "
                    "mixture",
    "Marfoq et al. 2021, Federated Multi-Task Learning under a Mixture of Distributions", FedEMParams,
    Capabilities(uploads="every component's shared parameters, sample count, training loss", personalises=True,
                 stacks_runs=True, whole_model=False, compact_steps=True),
    privacy=(
        PrivacyRow(
            method="FedEM",
            config="`algorithm: fedem`",
            params="every component model's shared parameters",
            extra="`train_loss`",
            stays="data; its mixture weights π (`fedem.weights`) and its samples' responsibilities; optimiser "
                  "state when kept",
        ),
    ),
    family="personalised", venue="NeurIPS 2021",
))
