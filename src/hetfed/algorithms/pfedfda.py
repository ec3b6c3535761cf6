"""pFedFDA (McLaughlin, Wang, Zhou 2024, "Personalized Federated Learning via Feature Distribution Adaptation",
NeurIPS).

A shared body ``φ`` and, instead of a learnt head, a *generative* classifier: class-conditional Gaussians of the
representation ``z = φ(x)`` with class means ``μ_c`` and one shared covariance ``Σ``, read as linear discriminant
analysis (LDA) with the client's class priors ``π_c``:

    logit_c(z) = zᵀ Σ̃⁻¹ μ_c − ½ μ_cᵀ Σ̃⁻¹ μ_c + log π_c,   Σ̃ = (1 − ε)Σ + ε·tr(Σ)/d·I

(the authors' ``lda_classify``; ε = 10⁻⁴). The server holds the global statistics ``(μ^g, Σ^g)`` (initially
``μ^g ~ U[0, 1)``, ``Σ^g = I``). Each round a client

1. trains its body for E epochs on the cross-entropy of the LDA head built from the *global* statistics and its
   own priors (the head is fixed: only the body moves), so every client's features are pulled towards the
   global class distributions;
2. estimates its local statistics on its training features: a class's mean where it holds more than two samples
   (the global mean otherwise), and ``Σ = S/(N − 1) + ε + I`` from the within-class scatter ``S`` (the authors'
   code adds ε to every entry and the identity: positive definite by construction, so their nearest-PSD clip is
   the identity here and is not applied);
3. chooses the interpolation ``β = (β_μ, β_Σ) ∈ [0, 1]²`` that minimises the cross-entropy of the LDA head with
   ``β·local + (1 − β)·global`` statistics over two-fold stratified cross-validation of its training features
   (classes with fewer than two samples left out; folds drawn with seed 0, as the authors' code), from
   ``β = 0.5`` with at most 10 L-BFGS iterations — here SciPy's bounded L-BFGS-B, where the authors' code runs
   ``torchmin``'s unbounded L-BFGS on a loss that clips β (same optimum; a finite-difference-free gradient from
   autograd); if no fold can be built it takes β = 0 (the global statistics), as the authors' code;
4. uploads its body and its *adaptive* statistics ``μ̂ = β_μ μ + (1 − β_μ) μ^g``, ``Σ̂ = β_Σ Σ + (1 − β_Σ) Σ^g``.

The server averages the bodies (the server pipeline) and the adaptive statistics, weighted by training samples.
A client predicts (the authors' ``evaluate_personalized``) with the *global* body and an LDA head from its
adaptive statistics, refitted on its training data at evaluation time; the server's model is the global body
with the global statistics and uniform priors. The features of step 2 are the trained body's on the training
data in one extra pass (the authors' code keeps the features of its training batches, computed by a body that
changes between them; FL-bench fits them on the *test* set at evaluation only, which leaks test labels).
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field

from hetfed.algorithms._personal import body_of, head_of
from hetfed.algorithms.fedavg import FedAvg, kept_optimizer_state, train_clients
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.evaluate import ClientEvalData, Predictor, predict, scores
from hetfed.engine.local import StackObjective, client_mean, row_cross_entropy
from hetfed.engine.types import Broadcast, ClientData, ClientState, ServerState, Upload, index_on, split_state
from hetfed.errors import ConfigError
from hetfed.interface import global_params
from hetfed.models.base import Derived, Model, Noise, Params, ParamSpec, Representation

COEF, BIAS = "fda.coef", "fda.bias"
MEANS, COV = "fda_means", "fda_cov"


class PFedFDAParams(AlgorithmParams):
    eps: float = Field(1e-4, gt=0, lt=1, description="ε: the prior smoothing, the covariance's shrinkage to its "
                                                     "scaled trace and the entries' offset (the authors' 1e-4)")
    folds: int = Field(2, ge=2, description="cross-validation folds for β (the authors' 2)")
    max_iter: int = Field(10, ge=1, description="L-BFGS iterations for β (the authors' 10)")
    single_beta: bool = Field(False, description="one β for means and covariance (the authors' --single_beta)")
    local_beta: bool = Field(False, description="β = 1: the local statistics alone (the authors' --local_beta)")


def lda_head(means: torch.Tensor, cov: torch.Tensor, priors: torch.Tensor, eps: float
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """LDA's linear head ``(W [.., C, d], b [.., C])`` for class means ``[.., C, d]``, a shared covariance
    ``[.., d, d]`` and class priors ``[.., C]`` (the authors' ``lda_classify`` with its shrinkage)."""
    d = cov.shape[-1]
    eye = torch.eye(d, dtype=cov.dtype, device=cov.device)
    trace = cov.diagonal(dim1=-2, dim2=-1).sum(-1)[..., None, None]
    shrunk = (1 - eps) * cov + eps * trace / d * eye
    coef = torch.linalg.solve(shrunk, means.transpose(-1, -2)).transpose(-1, -2)  # Σ̃⁻¹ μ_c, row per class
    bias = -0.5 * (means * coef).sum(-1) + priors.log()
    return coef, bias


def smoothed_priors(counts: torch.Tensor, eps: float) -> torch.Tensor:
    """Class frequencies ``[.., C]`` from class counts, plus ε, normalised (never a zero prior: its log is
    finite)."""
    counts = counts.double()
    p = counts / counts.sum(-1, keepdim=True).clamp(min=1) + eps
    return p / p.sum(-1, keepdim=True)


def class_priors(labels: torch.Tensor, n_classes: int, eps: float) -> torch.Tensor:
    """One client's :func:`smoothed_priors` from its labels."""
    return smoothed_priors(torch.bincount(labels.long(), minlength=n_classes), eps)


def mle_statistics(z: torch.Tensor, labels: torch.Tensor, global_means: torch.Tensor, eps: float,
                   min_samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Class means (a class with at most ``min_samples`` samples takes the global mean) and the shared covariance
    ``S/(N − 1) + ε + I``, ``S`` the within-class scatter (the authors' ``compute_mle_statistics``)."""
    counts = torch.bincount(labels, minlength=len(global_means))
    sums = torch.zeros_like(global_means).index_add_(0, labels, z)
    own = counts > min_samples
    means = torch.where(own[:, None], sums / counts.clamp(min=1)[:, None], global_means)
    centred = z - means[labels]
    scatter = centred.T @ centred
    d = z.shape[1]
    cov = scatter / max(len(z) - 1, 1) + eps + torch.eye(d, dtype=z.dtype, device=z.device)
    return means, cov


def solve_beta(z: torch.Tensor, labels: torch.Tensor, global_means: torch.Tensor, global_cov: torch.Tensor,
               priors: torch.Tensor, p: PFedFDAParams) -> tuple[float, float]:
    """``(β_μ, β_Σ)`` minimising the held-out folds' cross-entropy of the interpolated LDA head (the authors'
    ``solve_beta``); ``(0, 0)`` where no stratified split exists."""
    if p.local_beta:
        return 1.0, 1.0
    labels_np = labels.cpu().numpy()
    values, counts = np.unique(labels_np, return_counts=True)
    keep = ~np.isin(labels_np, values[counts < p.folds])
    zk, yk = z[torch.as_tensor(keep, device=z.device)], labels_np[keep]
    # here: importing scikit-learn costs ~1 s per process
    from sklearn.model_selection import StratifiedKFold

    try:
        splits = list(StratifiedKFold(n_splits=p.folds, shuffle=True, random_state=0).split(np.zeros(len(yk)), yk))
    except ValueError:  # fewer samples than folds: the global statistics
        return 0.0, 0.0
    folds = []
    for train, test in splits:
        ytr = torch.as_tensor(yk[train], device=z.device)
        means, cov = mle_statistics(zk[train], ytr, global_means, p.eps, p.folds)
        folds.append((means, cov, zk[test], torch.as_tensor(yk[test], device=z.device)))

    def loss(beta: np.ndarray) -> tuple[float, np.ndarray]:
        b = torch.tensor(beta, dtype=z.dtype, device=z.device, requires_grad=True)
        bm, bc = (b[0], b[0]) if p.single_beta else (b[0], b[1])
        total = z.new_zeros(())
        for means, cov, zt, yt in folds:
            coef, bias = lda_head(bm * means + (1 - bm) * global_means, bc * cov + (1 - bc) * global_cov,
                                  priors, p.eps)
            total = total + torch.nn.functional.cross_entropy(zt @ coef.T + bias, yt)
        total.backward()
        assert b.grad is not None
        return float(total.detach()), b.grad.cpu().numpy().astype(np.float64)

    # here: SciPy's optimisers cost ~0.4 s to import, in every ClientApp
    from scipy.optimize import minimize

    n = 1 if p.single_beta else 2
    result = minimize(loss, np.full(n, 0.5), jac=True, method="L-BFGS-B", bounds=[(0.0, 1.0)] * n,
                      options={"maxiter": p.max_iter, "gtol": 1e-3})
    beta = np.clip(result.x, 0.0, 1.0)
    return float(beta[0]), float(beta[-1])


def adaptive_statistics(z: torch.Tensor, labels: torch.Tensor, global_means: torch.Tensor, global_cov: torch.Tensor,
                        priors: torch.Tensor, p: PFedFDAParams) -> tuple[torch.Tensor, torch.Tensor]:
    """One client's ``(μ̂, Σ̂)``: its β by cross-validation, then ``β·local + (1 − β)·global`` (float64)."""
    z, labels = z.double(), labels.long()
    gm, gc = global_means.double().to(z.device), global_cov.double().to(z.device)
    b_mean, b_cov = solve_beta(z, labels, gm, gc, priors, p)
    means, cov = mle_statistics(z, labels, gm, p.eps, p.folds)
    return b_mean * means + (1 - b_mean) * gm, b_cov * cov + (1 - b_cov) * gc


def _zeros(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.zeros(shape)


class LDAHead(Derived):
    """The base's body with a linear head per client from its Gaussian statistics (``fda.coef``, ``fda.bias``)."""

    def __init__(self, base: Model):
        c, d = base.n_classes, base.latent_dim
        super().__init__(base, [ParamSpec(COEF, (c, d), _zeros, local=True), ParamSpec(BIAS, (c,), _zeros, local=True)])

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        z = self.base.features(params, x, noise)  # [n, b, d]
        return torch.einsum("nbd,ncd->nbc", z, params[COEF].to(z.dtype)) + params[BIAS].to(z.dtype)[:, None, :]


class PFedFDA(FedAvg):
    """FedAvg of the body; each client's head is LDA on Gaussian feature statistics interpolated between its own
    and the server's by a cross-validated β."""

    def __init__(self, model, train, params=None, context=None):
        super().__init__(model, train, params, context)
        self._body = body_of(model, "pfedfda")
        self._head = head_of(model, "pfedfda")
        self.lda = LDAHead(model)

    def server_init(self, gen: torch.Generator) -> ServerState:
        body = {k: v for k, v in self.model.init_shared(gen).items() if k not in self._head}
        c, d = self.model.n_classes, self.model.latent_dim
        return ServerState(body, extra={MEANS: torch.rand(c, d, generator=gen), COV: torch.eye(d)})

    def broadcast(self, state: ServerState, round: int) -> Broadcast:
        bc = super().broadcast(state, round)
        return Broadcast(bc.params, bc.round, bc.lr, {**bc.extra, MEANS: state.extra[MEANS], COV: state.extra[COV]})

    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        shapes = {k: torch.zeros(s.shape) for s in self.model.specs() if (k := s.name) in self._body}
        return {**self.model.init_local(gen), **kept_optimizer_state(self.train, shapes)}

    def _heads(self, means: torch.Tensor, cov: torch.Tensor, priors: torch.Tensor) -> Params:
        """Each client's LDA head from global statistics (``[C, d]`` and ``[d, d]``, or each client's own run's,
        ``[n, C, d]`` and ``[n, d, d]``: :meth:`_received`) and its priors ``[n, C]`` (a head solved per client is
        the one solved once for all: the same numbers, a test checks)."""
        coef, bias = lda_head(means.double().to(priors.device), cov.double().to(priors.device), priors,
                              self.params.eps)
        return {COEF: coef.expand(len(priors), *coef.shape[-2:]).float(), BIAS: bias.float()}

    @staticmethod
    def _received(bc: Broadcast, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The server's statistics as ``n`` clients' rows ``[n, C, d]``, ``[n, d, d]``: each client its own run's
        (a stacked sweep's joined clients come from runs with other statistics)."""
        return bc.extra_rows(MEANS, n), bc.extra_rows(COV, n)

    def _uniform(self, n: int, device: torch.device | None = None) -> torch.Tensor:
        """Uniform priors for ``n`` clients: the head of a client that has not adapted, and the server's."""
        return torch.full((n, self.model.n_classes), 1.0 / self.model.n_classes, dtype=torch.float64, device=device)

    def _objective(self, bc: Broadcast, data: ClientData, states: ClientState) -> StackObjective:
        return StackObjective(self._loss, {})  # the heads are among the step's tensors: nothing else per client

    def _loss(self, params: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, noise: Noise,
              inputs: Params) -> tuple[torch.Tensor, torch.Tensor]:
        """Each client's cross-entropy of its body under its fixed LDA head."""
        ce = client_mean(row_cross_entropy(self.lda.forward(params, xb, noise), yb), mask)
        return ce, ce

    def _adapt(self, bc: Broadcast, params: Params, x: torch.Tensor, y: torch.Tensor,
               indices: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each client's priors ``[n, C]`` and adaptive statistics ``[n, C, d]``, ``[n, d, d]`` from its training
        samples' features under ``params``."""
        reps = predict(Representation(self.model), params, x, indices)
        global_means, global_covs = self._received(bc, len(indices))
        priors, means, covs = [], [], []
        for z, index, gm, gc in zip(reps, indices, global_means, global_covs, strict=True):
            labels = y[index_on(index, y.device)].long().to(z.device)
            prior = class_priors(labels, self.model.n_classes, self.params.eps).to(z.device)
            m, c = adaptive_statistics(z, labels, gm, gc, prior, self.params)
            priors.append(prior)
            means.append(m)
            covs.append(c)
        return torch.stack(priors), torch.stack(means), torch.stack(covs)

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        local, kept_opt = split_state(states)
        priors = smoothed_priors(data.label_counts(self.model.n_classes), self.params.eps)
        params = {**bc.stacked(n), **local, **self._heads(*self._received(bc, n), priors)}
        trainable = [k for k in params if k in self._body or k in local]
        params, opt_state, loss = train_clients(self, params, kept_opt, data, bc.lr,
                                                objective=self._objective(bc, data, states), trainable=trainable)
        _, means, covs = self._adapt(bc, params, data.x, data.y, list(data.indices))
        upload = Upload.of(data, params, bc.params, loss, **{MEANS: means.float(), COV: covs.float()})
        return upload, {**{k: params[k] for k in local}, **opt_state}

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        new = super().aggregate(state, upload)
        means, cov = state.extra[MEANS], state.extra[COV]
        if upload.client_ids:
            w = upload.num_samples.to(torch.float64) / upload.num_samples.to(torch.float64).sum()
            means = (upload.extra[MEANS].double() * w[:, None, None]).sum(0).float().cpu()
            cov = (upload.extra[COV].double() * w[:, None, None]).sum(0).float().cpu()
        return ServerState(new.params, new.round, {**new.extra, MEANS: means, COV: cov})

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """The global body with the global statistics' head and uniform priors (what a client holds before it
        adapts to its training data; :meth:`evaluate_client` adapts)."""
        if not bc.has_extra(MEANS):  # a saved run's model: its parameters only
            raise ConfigError("client predictions of this saved pfedfda run are not possible: a client's head is "
                              "built from the server's Gaussian statistics, which runs written before hetfed saved "
                              "them beside the model (checkpoints/<model>-served.pt) lack; expected the run's metrics "
                              "(metrics.csv, summary.json) instead")
        local, _ = split_state(states)
        return Predictor(self.lda, {**bc.stacked(n), **local, **self._heads(*self._received(bc, n), self._uniform(n))},
                         True)

    @torch.no_grad()
    def fitted_predictor(self, bc: Broadcast, states: ClientState, data: ClientEvalData,
                         view: str | None = None) -> Predictor:
        """Each client refits its adaptive statistics on its training data under the global body; it predicts with
        the LDA head they give with its priors (the authors' ``evaluate_personalized``). Without its training
        rows, the global statistics."""
        n = len(data.client_ids)
        if data.train is None:
            return self.predictor(bc, states, n, view)
        local, _ = split_state(states)
        params = {**bc.stacked(n), **local}
        with torch.enable_grad():  # β's gradient
            priors, means, covs = self._adapt(bc, params, data.x, data.y, list(data.train))
        coef, bias = lda_head(means, covs, priors, self.params.eps)
        return Predictor(self.lda, {**params, COEF: coef.float(), BIAS: bias.float()}, True)

    @torch.no_grad()
    def evaluate_server(self, state: ServerState, x_global: torch.Tensor, y_global: torch.Tensor) -> dict[str, float]:
        """The global body with the global statistics and uniform priors on the balanced global test set."""
        params = global_params(self, state)
        device = next(iter(params.values())).device
        heads = {k: v.to(device) for k, v in self._heads(state.extra[MEANS], state.extra[COV],
                                                         self._uniform(1, device)).items()}
        s = scores(self.lda.forward({**params, **heads}, x_global.unsqueeze(0), None)[0], y_global)
        return {"server_accuracy": s["accuracy"], "server_loss": s["loss"]}


register(AlgorithmSpec(
    "pfedfda", PFedFDA, "FedAvg of the body; each client classifies with LDA on Gaussian feature statistics "
                        "interpolated between its own and the server's by a cross-validated β",
    "McLaughlin, Wang, Zhou 2024, Personalized Federated Learning via Feature Distribution Adaptation",
    PFedFDAParams,
    Capabilities(uploads="shared body parameters, sample count, training loss, its adaptive class means and "
                         "feature covariance", whole_round=True, personalises=True, whole_model=False,
                 compact_steps=True, stacks_runs=True),
    privacy=(
        PrivacyRow(
            method="pFedFDA",
            config="`algorithm: pfedfda`",
            params="shared model parameters (the body; no head)",
            extra="`train_loss`, `fda_means` (its adaptive class means of the representation), `fda_cov` (its "
                  "adaptive feature covariance)",
            stays="data; its class priors; β; optimiser state when kept",
        ),
    ),
    family="personalised", venue="NeurIPS 2024",
))
