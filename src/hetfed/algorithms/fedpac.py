"""FedPAC (Xu, Tong, Huang 2023, "Personalized Federated Learning with Feature Alignment and Classifier
Collaboration", ICLR), as PFLlib's ``clientpac`` / ``serverpac``.

The body (every layer but the classifier head) is shared; each client's head is its own, combined on the server
with the heads of the clients whose features look like its own.

A client's round:

1. **Statistics** of its features under the received body, for the server's combination: per class k the
   prior-weighted mean ``h_k = p_k·μ_k`` and the variance term
   ``V = (Σ_k p_k·tr(F_kᵀF_k/n_k) − Σ_k p_k²·‖μ_k‖²) / n`` (F_k its features of class k, p_k the class's share,
   n its training samples).
2. **Training**: one pass over its data on the head alone (body frozen), then the run's local epochs on the body
   alone (head frozen) with the **feature alignment** term ``λ·MSE(z, c_y)`` towards the global class centroids
   c (``params.lam``, PFLlib's 1.0; rows whose class has no global centroid are not pulled).
3. It uploads the body, its head, its class centroids (mean features after training) and its statistics.

The server averages the bodies (FedAvg, through the server pipeline) and the centroids (a class's mean over the
clients that have it), and for each client i solves **the classifier-combination quadratic program**
``min_α αᵀ(diag(V) + D_i)α`` over the simplex, ``D_i[j, l] = Σ_k ⟨h_i,k − h_j,k, h_i,k − h_l,k⟩``, with SciPy's SLSQP
(PFLlib uses cvxpy); weights below 1e-3 are zeroed (not renormalised) and a client whose matrix has no
non-negative spectrum after PFLlib's repair keeps its own head. Its head becomes ``Σ_j α_j·head_j`` — kept on
the server and sent to that client alone (:attr:`Broadcast.personal`).
"""

from __future__ import annotations

import numpy as np
import torch
from pydantic import Field

from hetfed.algorithms._personal import PartlyPersonal, head_of, second_pass
from hetfed.algorithms.fedavg import train_clients
from hetfed.algorithms.fedproto import at_labels, client_prototypes
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.evaluate import Predictor
from hetfed.engine.local import StackObjective, client_mean, row_cross_entropy, train_stack
from hetfed.engine.types import Broadcast, ClientData, ClientState, Params, ServerState, Upload, split_state
from hetfed.interface import server_step
from hetfed.models.base import Noise, prefixed

#: the server's combined head of parameter ``name`` for each client: ``pac.<name>`` (a personal row)
HEAD = "pac."
KNOWN = "pac.known"


class FedPACParams(AlgorithmParams):
    lam: float = Field(1.0, ge=0, description="λ, the feature alignment weight (PFLlib's --lamda default 1.0)")


@torch.no_grad()
def feature_statistics(z: torch.Tensor, y: torch.Tensor, n_classes: int) -> tuple[torch.Tensor, float]:
    """One client's (h [C, d], V) from its features ``z`` [m, d] and labels ``y`` [m] (PFLlib's
    ``statistics_extraction``)."""
    m = len(y)
    h = torch.zeros(n_classes, z.shape[1], dtype=torch.float64)
    if m == 0:
        return h, 0.0
    p = torch.bincount(y, minlength=n_classes).double() / m
    v = 0.0
    for k in torch.unique(y).tolist():
        f = z[y == k].double()
        mu = f.mean(0)
        h[k] = p[k] * mu
        v += float(p[k] * torch.trace(f.T @ f / len(f))) - float(p[k] ** 2 * (mu * mu).sum())
    return h, v / m


def combination_weights(i: int, variances: torch.Tensor, h: torch.Tensor) -> np.ndarray | None:
    """Client i's head weights α over the round's clients: ``min αᵀ(diag(V) + D_i)α`` on the simplex (PFLlib's
    ``solve_quadratic`` for one client, its spectral repair included; SLSQP in place of cvxpy), small weights
    zeroed; None when no non-negative-definite matrix results."""
    diff = (h[i].unsqueeze(0) - h).flatten(1)  # [n, C·d]: h_i − h_j over every class
    p = np.diag(variances.double().numpy()) + (diff @ diff.T).numpy()
    if not np.all(np.linalg.eigvalsh(p) >= 0.0):
        evals, evecs = np.linalg.eigh(p)
        keep = evals >= 0.01
        p = (evecs[:, keep] * evals[keep]) @ evecs[:, keep].T
        if not np.all(np.linalg.eigvalsh(p) >= -1e-12):
            return None
    # here: SciPy's optimisers cost ~0.4 s to import, in every ClientApp
    from scipy.optimize import minimize

    n = len(p)
    result = minimize(lambda a: float(a @ p @ a), np.full(n, 1.0 / n), jac=lambda a: 2 * p @ a, method="SLSQP",
                      bounds=[(0.0, None)] * n, constraints=[{"type": "eq", "fun": lambda a: a.sum() - 1.0}],
                      options={"ftol": 1e-12, "maxiter": 500})
    alpha = np.clip(result.x, 0.0, None)
    return alpha * (alpha > 1e-3)


class FedPAC(PartlyPersonal):
    """A shared body aligned to global class centroids; each client's head combined with similar clients'."""


    def personal_names(self) -> tuple[str, ...]:
        return head_of(self.model, self.spec.name)

    def server_init(self, gen: torch.Generator) -> ServerState:
        state = super().server_init(gen)
        d = self.model.latent_dim
        return ServerState(state.params, 0, {"centroids": torch.zeros(self.model.n_classes, d),
                                             "known": torch.zeros(self.model.n_classes)})

    def broadcast(self, state: ServerState, round: int) -> Broadcast:
        bc = super().broadcast(state, round)
        extra = {**bc.extra, "centroids": state.extra["centroids"], "known": state.extra["known"]}
        heads = state.extra.get("heads")
        personal = {**prefixed(heads, HEAD), KNOWN: state.extra["has_head"]} if heads else {}
        return Broadcast(bc.params, bc.round, bc.lr, extra, personal=personal)

    def _head(self, bc: Broadcast, local: Params) -> Params:
        """Each client's head: the server's combination where it has one, else its own."""
        if not bc.personal:
            return {k: local[k] for k in self.personal_names()}
        out = {}
        for k in self.personal_names():
            combined = bc.personal[HEAD + k].to(local[k])
            has = bc.personal[KNOWN].to(local[k].device).bool().view(-1, *([1] * (local[k].dim() - 1)))
            out[k] = torch.where(has, combined, local[k])
        return out

    def _aligned(self, bc: Broadcast, data: ClientData) -> StackObjective:
        """The body's loss over each client's run's class centroids [n, C, d] and which classes have one [n, C] (a
        stacked sweep's stack holds several runs), declared: its steps are recorded and compute only the clients
        still training."""
        n, device = len(data.client_ids), data.x.device
        return StackObjective(self._aligned_loss, {"centroids": bc.extra_rows("centroids", n).to(device),
                                                   "known": bc.extra_rows("known", n).bool().to(device)})

    def _aligned_loss(self, params: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, noise: Noise,
                      inputs: Params) -> tuple[torch.Tensor, torch.Tensor]:
        """The cross-entropy plus λ · the features' squared distance to their class's centroid where it has one
        (reporting the cross-entropy)."""
        z = self.model.features(params, xb, noise)
        ce = client_mean(row_cross_entropy(self.model.head(params, z), yb), mask)
        y = yb.long()
        target = torch.where(at_labels(inputs["known"], y)[..., None], at_labels(inputs["centroids"].to(z), y),
                             z.detach())
        return ce + self.params.lam * client_mean(((z - target) ** 2).mean(-1), mask), ce

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        n = len(data.client_ids)
        local, kept_opt = split_state(states)
        head = self._head(bc, local)
        params = {**bc.stacked(n), **local, **head}
        stats = self._statistics(params, data)
        body = list(bc.params)
        params, _, _ = train_stack(self.model, params, second_pass(data, 1), self.schedule.one_epoch(),  # the head
                                   self.train.optimizer, bc.lr, trainable=list(self.personal_names()))
        params, opt_state, loss = train_clients(self, params, kept_opt, data, bc.lr, objective=self._aligned(bc, data),
                                                trainable=body)  # the body, the head frozen
        centroids, counts = client_prototypes(self.model, params, data)
        upload = Upload(list(data.client_ids), {k: params[k] for k in body}, data.sizes(loss.device),
                        {"train_loss": loss, "centroids": centroids.to(loss.device),
                         "label_counts": counts.to(loss.device), "head": self._flat_head(params, n), **stats})
        return upload, {**{k: params[k] for k in local}, **opt_state}

    def _flat_head(self, params: Params, n: int) -> torch.Tensor:
        """The clients' heads as one row each ``[n, P]`` (an upload's extra is one tensor per name)."""
        return torch.cat([params[k].reshape(n, -1) for k in self.personal_names()], dim=1)

    def _unflat_head(self, flat: torch.Tensor) -> Params:
        """:meth:`_flat_head`'s rows back into the head's tensors ``[n, …]``."""
        shapes = {s.name: tuple(s.shape) for s in self.model.specs()}
        out, at = {}, 0
        for k in self.personal_names():
            size = int(np.prod(shapes[k]))
            out[k] = flat[:, at:at + size].reshape(len(flat), *shapes[k])
            at += size
        return out

    @torch.no_grad()
    def _statistics(self, params: Params, data: ClientData) -> dict[str, torch.Tensor]:
        """Each client's (h [C, d], V) under the received body: the QP's inputs."""
        from hetfed.engine.evaluate import predict
        from hetfed.models.base import Representation

        reps = predict(Representation(self.model), params, data.x, data.indices)
        hs, vs = [], []
        for z, index in zip(reps, data.indices, strict=True):
            y = data.y[torch.as_tensor(index, device=data.y.device)].long().cpu()
            h, v = feature_statistics(z.cpu(), y, self.model.n_classes)
            hs.append(h.float())
            vs.append(v)
        return {"pac_h": torch.stack(hs).to(data.x.device), "pac_v": torch.tensor(vs, device=data.x.device)}

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        params, extra = server_step(self, state, upload)
        new_extra = {**state.extra, **extra}
        if upload.client_ids:
            counts = upload.extra["label_counts"].cpu()
            present = (counts > 0).double()
            total = present.sum(0)
            mean = (upload.extra["centroids"].cpu().double() * present[..., None]).sum(0) / total.clamp(min=1)[:, None]
            new_extra["centroids"] = mean.float()
            new_extra["known"] = (total > 0).float()
            heads = dict(state.extra.get("heads") or {})
            has = state.extra.get("has_head", torch.zeros(self._clients)).clone()
            names = self.personal_names()
            uploaded = self._unflat_head(upload.extra["head"].cpu().double())
            for k in names:
                heads[k] = heads[k].clone() if k in heads else torch.zeros(self._clients, *uploaded[k].shape[1:])
            h, v = upload.extra["pac_h"].cpu(), upload.extra["pac_v"].cpu()
            for i, cid in enumerate(upload.client_ids):
                alpha = combination_weights(i, v, h)
                if alpha is None:
                    continue
                w = torch.as_tensor(alpha, dtype=torch.float64)
                for k in names:
                    heads[k][cid] = torch.tensordot(w, uploaded[k], dims=1).float()
                has[cid] = 1.0
            new_extra["heads"], new_extra["has_head"] = heads, has
        return ServerState(params, state.round + 1, new_extra)

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """The global body with the client's head (the server's combination once it has one)."""
        local, _ = split_state(states)
        return Predictor(self.model, {**bc.stacked(n), **local, **self._head(bc, local)}, True)


register(AlgorithmSpec(
    "fedpac", FedPAC, "a shared body aligned to global class centroids; each client's head combined with the heads "
                      "of clients with similar features by a small quadratic program",
    "Xu et al. 2023, Personalized Federated Learning with Feature Alignment and Classifier Collaboration",
    FedPACParams,
    Capabilities(uploads="shared parameters of the body, its head, class centroids and counts, feature "
                         "statistics, sample count, training loss", whole_round=True, personalises=True,
                         per_client=True, stacks_runs=True, whole_model=False, compact_steps=True),
    privacy=(
        PrivacyRow(
            method="FedPAC",
            config="`algorithm: fedpac`",
            params="the body: every layer but the classifier head",
            extra="`train_loss`, `centroids` (its mean feature per class), `label_counts`, `head` (its trained "
                  "head, flattened), `pac_h` (its prior-weighted class means), `pac_v` (its feature variance term)",
            stays="data; optimiser state when kept (the server keeps a combined head per client and sends each "
                  "its own)",
        ),
    ),
    family="personalised", venue="ICLR 2023",
))
