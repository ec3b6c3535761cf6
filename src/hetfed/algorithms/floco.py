"""Floco (Grinwald, Wiesner, Nakajima 2024, "Federated Learning over Connected Modes", NeurIPS).

The classifier's weight becomes a *solution simplex*: M endpoints ``W_1 … W_M`` (the bias stays one), and a point
``α`` of the simplex is the model ``W(α) = Σ_m α_m W_m``. Everything is averaged as in FedAvg (body, bias and every
endpoint, through the server pipeline); what differs is which points each client trains:

- **before round τ** every client samples, at every step, ``α`` uniformly from the whole simplex (normalised
  exponential draws, a Dirichlet(1, …, 1)); every client evaluates at the simplex's centre ``α = 1/M``;
- **in round τ − 1** every client trains (the server samples all of them, as the authors' code, to collect every
  client's signal); the server projects the clients' *gradient signals* — each one's update of the endpoints,
  ``W_global − W_client`` flattened — onto the simplex: PCA to M dimensions, then the Euclidean projection of each
  row onto the simplex scaled by z (Duchi et al. 2008), renormalised, with z on a grid of 1000 values in
  [10⁻⁴, 1] chosen to minimise the points' Riesz s-energy (s = 2: the clients spread out over the simplex). Each
  client's point is the centre ``c_i`` of its *subregion*;
- **from round τ on** a client samples, at every step, ``α = c_i + r·u`` (``u`` a random direction of the L1
  sphere, ``r ~ U[0, ρ]``), renormalised to sum to one (FL-bench's ``SimplexRegion``; the Flower baseline omits the
  renormalisation), and predicts with ``α = c_i``. The server keeps the centres, an M-vector per client, and
  sends each client its own (:attr:`hetfed.engine.types.Broadcast.personal`).

Defaults are the authors' Flower baseline for CIFAR-10 (``conf/cifar10_dir_floco.toml``): M = 10 endpoints, ρ = 0.3
and τ at half the run (250 of its 500 rounds; ``params.tau`` sets a round). The step's ``α`` draws come from the
client's own stream (:meth:`hetfed.models.base.Noise.uniforms`: the same numbers on every executor). The server
model (unseen clients, the global test set) is the simplex's centre. The endpoints start as independent
Xavier-normal draws, as the authors' code (an average of M draws of the model's own, smaller, head initialisation
trains visibly slower). Departures: PCA is exact (``svd_solver="full"``; scikit-learn's default is randomised at this
size); in round τ − 1 every
client's update is averaged (the authors' code averages only the clients sampled for that round; the same with
every client in every round); Floco+'s personal fine-tuning (``pers_epoch`` > 0) is not built.
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field

from hetfed.algorithms._personal import head_of
from hetfed.algorithms.fedavg import FedAvg, kept_optimizer_state
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.evaluate import Predictor, scores
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
from hetfed.interface import global_params
from hetfed.models.base import Derived, Model, Noise, ParamSpec

#: endpoint m of head weight ``name``: shared parameter ``floco.<m>.<name>``
ENDPOINT = "floco.{m}.{name}"
#: the point of the simplex a client predicts with (a stacked input of the predictor, ``[n, M]``)
ALPHA = "floco.alpha"
#: the server's table of subregion centres (and a client's personal row)
CENTRE = "floco.centre"


class FlocoParams(AlgorithmParams):
    endpoints: int = Field(10, ge=1, description="M, the solution simplex's endpoints (the authors' 10)")
    rho: float = Field(0.3, ge=0, description="ρ, the L1 radius of a client's subregion (the authors' 0.3)")
    tau: int | None = Field(None, ge=2, description="the round (from 1) that starts the subregions; the clients' "
                                                    "signals are those of round τ − 1 (default: half the rounds, "
                                                    "the authors' 250 of 500)")


def simplex_projection(v: np.ndarray, z: float) -> np.ndarray:
    """Each row's Euclidean projection onto ``{β ≥ 0, Σβ = z}`` (Duchi et al. 2008, the authors' ``projection``)."""
    u = np.sort(v, axis=1)[:, ::-1]
    cssv = np.cumsum(u, axis=1) - z
    ind = np.arange(1, v.shape[1] + 1)
    rho = np.count_nonzero(u - cssv / ind > 0, axis=1)
    theta = cssv[np.arange(len(v)), rho - 1] / rho
    return np.maximum(v - theta[:, None], 0)


def riesz_log_energy(points: np.ndarray, eps: float = 1e-4) -> float:
    """``log(Σ_{i<j} ‖p_i − p_j‖⁻²) − log(#pairs)``, distances floored at ε (the authors' Riesz s-energy, s = 2)."""
    i, j = np.triu_indices(len(points), 1)
    if len(i) == 0:
        return 0.0
    dist = np.maximum(np.sqrt(((points[i] - points[j]) ** 2).sum(1)), eps)
    return float(np.log((1.0 / dist**2).sum()) - np.log(len(i)))


def project_clients(signals: np.ndarray, endpoints: int) -> np.ndarray:
    """Each client's subregion centre on the simplex ``[k, M]`` from its gradient signal ``[k, P]``: PCA to M
    dimensions, then the z-scaled simplex projection whose renormalised points have the least Riesz energy."""
    k = min(endpoints, *signals.shape)
    kappa = np.zeros((len(signals), endpoints))
    # here: scikit-learn costs ~1 s to import, in every ClientApp process
    from sklearn.decomposition import PCA

    kappa[:, :k] = PCA(n_components=k, svd_solver="full").fit_transform(signals.astype(np.float64))
    best, lowest = np.full((len(signals), endpoints), 1.0 / endpoints), np.inf
    for z in np.linspace(1e-4, 1, 1000):
        beta = simplex_projection(kappa, z)
        beta = beta / beta.sum(1, keepdims=True)
        energy = riesz_log_energy(beta)
        if np.isfinite(energy) and energy < lowest:
            best, lowest = beta, energy
    return best


def simplex_alphas(u: torch.Tensor, centres: torch.Tensor | None, rho: float) -> torch.Tensor:
    """Each client's step point ``[n, M]`` from its uniforms ``u [n, 2M + 1]``: uniform on the simplex (no centres),
    else ``c + r·u_L1`` with ``r ~ U[0, ρ]``, renormalised."""
    m = u.shape[1] // 2
    if centres is None:
        e = -torch.log1p(-u[:, :m])  # Exp(1)
        return e / e.sum(1, keepdim=True)
    v = 2 * u[:, m:2 * m] - 1
    direction = v / v.abs().sum(1, keepdim=True).clamp(min=1e-12)
    alpha = centres + rho * u[:, 2 * m:] * direction
    return alpha / alpha.sum(1, keepdim=True)


def xavier_normal(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """Glorot's normal initialisation, ``N(0, 2/(fan_in + fan_out))`` for a 2-D weight (the authors' endpoints)."""
    fans = shape[0] + shape[1] if len(shape) == 2 else 2 * int(np.prod(shape[1:]))
    return torch.randn(shape, generator=gen) * (2.0 / fans) ** 0.5


class Simplex(Derived):
    """The base model with each head weight replaced by M endpoints; ``floco.alpha`` ``[n, M]`` picks the point."""

    def __init__(self, base: Model, endpoints: int):
        head = head_of(base, "floco")
        self.weights = [s.name for s in base.specs() if s.name in head and len(s.shape) >= 2]
        self.m = endpoints
        specs = [s for s in base.specs() if s.name not in self.weights]
        extra = [ParamSpec(ENDPOINT.format(m=m, name=s.name), s.shape, xavier_normal)
                 for m in range(endpoints) for s in base.specs() if s.name in self.weights]
        super().__init__(base, extra)
        self._specs = [*specs, *extra]

    def endpoints(self) -> list[str]:
        return [ENDPOINT.format(m=m, name=w) for m in range(self.m) for w in self.weights]

    def at(self, params: Params, alpha: torch.Tensor) -> Params:
        """The base's parameters at the simplex point ``alpha`` ``[n, M]``."""
        out = dict(params)
        for w in self.weights:
            stacked = torch.stack([params[ENDPOINT.format(m=m, name=w)] for m in range(self.m)], 1)  # [n, M, ...]
            a = alpha.to(stacked.dtype).view(*alpha.shape, *([1] * (stacked.dim() - 2)))
            out[w] = (a * stacked).sum(1)
        return out

    def logits(self, params: Params, x: torch.Tensor, noise: Noise | None, alpha: torch.Tensor) -> torch.Tensor:
        return self.base.forward(self.at(params, alpha), x, noise)

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        return self.logits(params, x, noise, params[ALPHA])


class Floco(FedAvg):
    """FedAvg of a model whose classifier is a simplex of endpoints; each client trains and predicts in its own
    subregion of the simplex once the server has placed it there."""

    def __init__(self, model, train, params=None, context=None):
        super().__init__(model, train, params, context)
        self.simplex = Simplex(model, self.params.endpoints)
        self.tau = self.params.tau if self.params.tau is not None else max(2, train.rounds // 2)

    def server_init(self, gen: torch.Generator) -> ServerState:
        return ServerState(params=self.simplex.init_shared(gen))

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        shapes = {s.name: torch.zeros(s.shape) for s in self.simplex.specs()}
        return {**self.model.init_local(gen), **kept_optimizer_state(self.train, shapes)}

    def _collects(self, state: ServerState) -> bool:
        """The coming round is τ − 1: every client trains, and its update places it."""
        return state.round + 1 == self.tau - 1

    def select_clients(self, state: ServerState, eligible: np.ndarray, m: int,
                       rng: np.random.Generator) -> list[int] | None:
        return [int(k) for k in eligible] if self._collects(state) else None

    def broadcast(self, state: ServerState, round: int) -> Broadcast:
        bc = super().broadcast(state, round)
        if CENTRE not in state.extra:
            return bc
        return Broadcast(bc.params, bc.round, bc.lr, bc.extra, personal={CENTRE: state.extra[CENTRE]})

    def _objective(self, bc: Broadcast, data: ClientData, states: ClientState) -> StackObjective:
        """The round's loss, over each client's subregion centre once the server has placed the clients."""
        centres = bc.personal.get(CENTRE)
        return StackObjective(self._loss, {} if centres is None else {"centre": centres.to(data.x.device)})

    def _loss(self, params: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, noise: Noise,
              inputs: Params) -> tuple[torch.Tensor, torch.Tensor]:
        """Each client's cross-entropy at a point drawn in its subregion of the simplex (the whole simplex before
        the clients are placed)."""
        u = noise.uniforms(1, 2 * self.params.endpoints + 1)[:, 0]  # [n, 2M + 1]
        centre = inputs.get("centre")
        alpha = simplex_alphas(u, None if centre is None else centre.to(u), self.params.rho)
        ce = client_mean(row_cross_entropy(self.simplex.logits(params, xb, noise, alpha), yb), mask)
        return ce, ce

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        new = super().aggregate(state, upload)
        if not (self._collects(state) and upload.client_ids):
            return new
        names = self.simplex.endpoints()
        signals = torch.cat([(state.params[k].to(upload.params[k]) - upload.params[k]).flatten(1) for k in names], 1)
        table = self._centre(self._clients)
        placed = project_clients(signals.detach().cpu().double().numpy(), self.params.endpoints)
        table[torch.as_tensor(upload.client_ids, dtype=torch.long)] = torch.as_tensor(placed, dtype=table.dtype)
        return ServerState(new.params, new.round, {**new.extra, CENTRE: table})

    def _centre(self, n: int) -> torch.Tensor:
        """The simplex's centre ``1/M`` for ``n`` clients: every point before the subregions, the server's model."""
        return torch.full((n, self.params.endpoints), 1.0 / self.params.endpoints)

    def _alpha(self, bc: Broadcast, n: int) -> torch.Tensor:
        return bc.personal[CENTRE] if CENTRE in bc.personal else self._centre(n)

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """Each client predicts at its subregion's centre (the simplex's centre before round τ; a saved run keeps
        the server's centres beside its model: :func:`hetfed.interface.served`)."""
        local, _ = split_state(states)
        params = {**bc.stacked(n), **local}
        device = next(iter(params.values())).device
        return Predictor(self.simplex, {**params, ALPHA: self._alpha(bc, n).to(device)}, True)

    @torch.no_grad()
    def evaluate_server(self, state: ServerState, x_global: torch.Tensor, y_global: torch.Tensor) -> dict[str, float]:
        """The simplex's centre on the balanced global test set."""
        params = global_params(self, state)
        centre = self._centre(1).to(next(iter(params.values())).device)
        s = scores(self.simplex.logits(params, x_global.unsqueeze(0), None, centre)[0], y_global)
        return {"server_accuracy": s["accuracy"], "server_loss": s["loss"]}


register(AlgorithmSpec(
    "floco", Floco, "FedAvg of a model whose classifier is a simplex of endpoints; the server places each client "
                    "in a subregion of the simplex by its gradient signal, where it trains and predicts",
    "Grinwald, Wiesner, Nakajima 2024, Federated Learning over Connected Modes", FlocoParams,
    Capabilities(whole_round=True, personalises=True, per_client=True, stacks_runs=True, whole_model=False,
                 compact_steps=True),
    privacy=(
        PrivacyRow(
            method="Floco",
            config="`algorithm: floco`",
            params="shared model parameters (the body, the head's bias and every simplex endpoint)",
            extra="`train_loss`",
            stays="data; the points of the simplex it trained at; optimiser state when kept",
        ),
    ),
    family="personalised", venue="NeurIPS 2024",
))
