"""pFedHN (Shamsian, Navon, Fetaya, Chechik 2021, "Personalized Federated Learning using Hypernetworks", ICML), as
its authors' code (``AvivSham/pFedHN``: ``CNNHyper``, ``trainer.py``).

The server trains a **hypernetwork** h(·; φ) that maps a learned embedding v_i of each client to that client's
whole model, θ_i = h(v_i; φ): an MLP (``params.hidden`` units, ``params.layers`` hidden layers after the first,
ReLU) from v_i to a feature vector, and one linear head per parameter tensor of the model. Each round the server
generates every chosen client's model and sends it to that client alone (:attr:`Broadcast.personal`); the client
trains it with the run's local SGD to θ̃_i and uploads it. The server then takes one step of its own optimiser
on φ (and the embeddings) per client, along the authors' gradient ``(∂θ_i/∂φ)ᵀ (θ_i − θ̃_i)`` — the
vector-Jacobian product of the generated model with the client's change — clipped to norm 50, with SGD
(``params.server_lr`` 0.01, momentum 0.9, weight decay 1e-3: the authors' defaults). A client predicts with its
generated model; there is no global model.

Defaults are the authors' code's (``--hyper-hid 100``, ``--n-hidden 3``, embedding size ``1 + N/4``). The authors
generate, train and step one client at a time; a round here generates its clients' models from the same φ and
then takes their steps in turn (each client's gradient at that φ) — with one client per round
(``train.clients_per_round: 1``) it is their loop.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from pydantic import Field

from hetfed.algorithms.fedavg import FedAvg, train_clients
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.evaluate import Predictor
from hetfed.engine.types import Broadcast, ClientData, ClientState, Params, ServerState, Upload, split_state
from hetfed.models.base import linear_init, prefixed

#: the client's generated model ``pfedhn.<name>`` in its personal row
GENERATED = "pfedhn."


class PFedHNParams(AlgorithmParams):
    hidden: int = Field(100, ge=1, description="units of the hypernetwork's hidden layers (the authors' 100)")
    layers: int = Field(3, ge=0, description="hidden layers after the first (the authors' --n-hidden 3)")
    embedding: int | None = Field(None, ge=1, description="the client embedding's size (None: 1 + N/4, the "
                                                          "authors' default)")
    server_lr: float = Field(0.01, gt=0, description="the hypernetwork's SGD learning rate (the authors' 1e-2)")
    momentum: float = Field(0.9, ge=0, lt=1, description="its momentum (0.9)")
    weight_decay: float = Field(1e-3, ge=0, description="its weight decay (1e-3)")
    clip: float = Field(50.0, gt=0, description="the gradient's norm clip (50)")


def hypernetwork(gen: torch.Generator, clients: int, embedding: int, hidden: int, layers: int,
                 targets: dict[str, tuple[int, ...]]) -> Params:
    """φ: ``embeddings`` [N, e] (N(0, 1), as ``nn.Embedding``), ``mlp.<j>.weight/bias``, ``head.<name>.weight/bias``."""
    phi = {"embeddings": torch.randn(clients, embedding, generator=gen)}
    sizes = [embedding] + [hidden] * (layers + 1)
    for j, (a, b) in enumerate(zip(sizes, sizes[1:], strict=False)):
        phi[f"mlp.{j}.weight"], phi[f"mlp.{j}.bias"] = linear_init(gen, a, b)
    for name, shape in targets.items():
        phi[f"head.{name}.weight"], phi[f"head.{name}.bias"] = linear_init(gen, hidden, math.prod(shape))
    return phi


def generate(phi: Params, ids: torch.Tensor, targets: dict[str, tuple[int, ...]]) -> Params:
    """θ_i = h(v_i; φ) for the clients ``ids``: each target tensor stacked ``[len(ids), …]``."""
    return {k: v[0] for k, v in generate_runs({k: v.unsqueeze(0) for k, v in phi.items()}, ids.unsqueeze(0),
                                              targets).items()}


def generate_runs(phi: Params, ids: torch.Tensor, targets: dict[str, tuple[int, ...]]) -> Params:
    """θ = h(v; φ) of runs' hypernetworks stacked ``[R, …]`` for each run's clients ``ids`` ``[R, K]``: each target
    tensor ``[R, K, …]`` (each run's from its own φ: one batched product a layer)."""
    runs, k = ids.shape
    z = phi["embeddings"][torch.arange(runs, device=ids.device).unsqueeze(1), ids]
    j = 0
    while f"mlp.{j}.weight" in phi:
        if j:
            z = torch.relu(z)
        z = torch.baddbmm(phi[f"mlp.{j}.bias"].unsqueeze(1), z, phi[f"mlp.{j}.weight"].transpose(1, 2))
        j += 1
    return {name: torch.baddbmm(phi[f"head.{name}.bias"].unsqueeze(1), z, phi[f"head.{name}.weight"].transpose(1, 2))
            .view(runs, k, *shape) for name, shape in targets.items()}


class PFedHN(FedAvg):
    """A server hypernetwork generates each client's model from its embedding."""


    def _targets(self) -> dict[str, tuple[int, ...]]:
        return {s.name: tuple(s.shape) for s in self.model.specs() if not s.local}

    def server_init(self, gen: torch.Generator) -> ServerState:
        p = self.params
        embedding = p.embedding or int(1 + self._clients / 4)
        phi = hypernetwork(gen, max(self._clients, 1), embedding, p.hidden, p.layers, self._targets())
        return ServerState({}, 0, {"hypernetwork": phi, "momentum": {}})

    def broadcast(self, state: ServerState, round: int) -> Broadcast:
        bc = super().broadcast(state, round)
        with torch.no_grad():
            phi = state.extra["hypernetwork"]
            models = generate(phi, torch.arange(self._clients, device=phi["embeddings"].device), self._targets())
        return Broadcast({}, bc.round, bc.lr, bc.extra, personal=prefixed(models, GENERATED))

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        local, kept_opt = split_state(states)
        start = {k: bc.personal[GENERATED + k] for k in self._targets()}
        params, opt_state, loss = train_clients(self, {**start, **local}, kept_opt, data, bc.lr)
        upload = Upload(list(data.client_ids), {k: params[k] for k in self._targets()}, data.sizes(loss.device),
                        {"train_loss": loss})
        return upload, {**{k: params[k] for k in local}, **opt_state}

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        return self.aggregate_runs([self], [state], [upload])[0]

    def aggregate_key(self, state: ServerState, upload: Upload) -> tuple:
        """Runs (of the same parameters and model) step their hypernetworks in one stack when they hold them on one
        device, for federations of one size, and as many clients answered (a sweep's seeds)."""
        embeddings = state.extra["hypernetwork"]["embeddings"]
        return (str(embeddings.device), tuple(embeddings.shape), len(upload.client_ids))

    @classmethod
    def aggregate_runs(cls, algos: Sequence[PFedHN], states: Sequence[ServerState],
                       uploads: Sequence[Upload]) -> list[ServerState]:
        """For each of a round's clients in turn (by id), one SGD step of φ along ``(∂θ_i/∂φ)ᵀ (θ_i − θ̃_i)``, clipped
        to its norm bound: the authors' loop, a server step per client (each client's gradient taken at the φ that
        generated its model) — for every run of a stacked sweep at once: each run's hypernetwork its own leaves (its
        own clipping and momentum), their models generated and each client row's vector-Jacobian products taken for
        all runs in one call. Each run's numbers as alone."""
        phis = [{k: v.detach().clone().requires_grad_(True) for k, v in s.extra["hypernetwork"].items()}
                for s in states]
        momenta = [s.extra["momentum"] for s in states]
        if uploads[0].client_ids:
            momenta = _step_hypernetworks(algos[0], phis, momenta, uploads)
        return [ServerState({}, s.round + 1, {**s.extra, "hypernetwork": {k: v.detach() for k, v in phi.items()},
                                              "momentum": momentum})
                for s, phi, momentum in zip(states, phis, momenta, strict=True)]

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """Each client predicts with the model the hypernetwork generates for it."""
        local, _ = split_state(states)
        return Predictor(self.model, {**{k: bc.personal[GENERATED + k] for k in self._targets()}, **local}, True)


register(AlgorithmSpec(
    "pfedhn", PFedHN, "a server hypernetwork generates each client's model from a learned client embedding",
    "Shamsian et al. 2021, Personalized Federated Learning using Hypernetworks", PFedHNParams,
    Capabilities(uploads="its trained model, sample count, training loss", whole_round=True, server_model=False,
                 personalises=True, per_client=True, stacks_runs=True),
    privacy=(
        PrivacyRow(
            method="pFedHN",
            config="`algorithm: pfedhn`",
            params="its whole trained model (the server compares it with the one it generated)",
            extra="`train_loss`",
            stays="data; optimiser state when kept (its embedding lives on the server)",
        ),
    ),
    family="personalised", venue="ICML 2021",
))


def _step_hypernetworks(algo: PFedHN, phis: list[Params], momenta: list[Params],
                        uploads: Sequence[Upload]) -> list[Params]:
    """:meth:`PFedHN.aggregate_runs`' steps: ``phis`` (each run's leaves) moved in place; each run's new momentum."""
    p, targets = algo.params, algo._targets()
    device = phis[0]["embeddings"].device
    ids = torch.stack([torch.as_tensor(u.client_ids, dtype=torch.long, device=device) for u in uploads])
    per_run = [list(phi.values()) for phi in phis]
    leaves = [leaf for run in per_run for leaf in run]
    with torch.enable_grad():
        generated = generate_runs({k: torch.stack([phi[k] for phi in phis]) for k in phis[0]}, ids, targets)
        changes = {k: (v - torch.stack([u.params[k].detach().to(v) for u in uploads])).detach()
                   for k, v in generated.items()}
        grads = []
        for row in range(ids.shape[1]):  # each client's vector-Jacobian product, every run's at once
            vjp = torch.autograd.grad([v[:, row] for v in generated.values()], leaves,
                                      grad_outputs=[c[:, row] for c in changes.values()], allow_unused=True,
                                      retain_graph=row + 1 < ids.shape[1])
            grads.append([torch.zeros_like(leaf) if gi is None else gi for leaf, gi in zip(leaves, vjp, strict=True)])
    # foreach: every run's leaves in one call (on a CPU the same numbers as torch's default loop over them)
    optimizer = torch.optim.SGD(leaves, lr=p.server_lr, momentum=p.momentum, weight_decay=p.weight_decay,
                                foreach=True)
    for phi, momentum in zip(phis, momenta, strict=True):
        for name, leaf in phi.items():
            if name in momentum:
                optimizer.state[leaf]["momentum_buffer"] = momentum[name].clone()
    for g in grads:  # each client's gradients are used once: clipping scales them in place
        for leaf, gi in zip(leaves, g, strict=True):
            leaf.grad = gi
        for run in per_run:  # each run's update clipped to its own norm
            torch.nn.utils.clip_grad_norm_(run, p.clip)
        optimizer.step()
    return [{name: optimizer.state[leaf]["momentum_buffer"].detach().clone() for name, leaf in phi.items()}
            for phi in phis]
