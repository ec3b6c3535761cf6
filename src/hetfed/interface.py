"""The algorithm interface: a few pure functions over explicit state.

This module sits between the engine (which runs algorithms) and the algorithms
(which use engine helpers such as ``train_stack``): both import it, it imports
neither, so the imports go one way.

An algorithm never knows which executor runs it. Every client-side step
receives a *stack* of clients (one client, a chunk, or all of them) and returns
per-client results; the executors decide how to stack and where the clients
live (in this process, or on Flower SuperNodes):

- ``local_update(broadcast, states, data) -> (Upload, states)`` — a round's training;
- ``personalise(broadcast, states, data) -> (states, info)`` — optional client-side
  work after federated training (FedMoE's fine-tuning and mixture); nothing of it
  leaves the client except the per-client ``info`` metrics (epochs, seconds);
- ``evaluate_client(broadcast, states, data, view) -> metrics`` — the client's model
  on its own validation/test data; only metrics leave the client.

The server side: ``server_init``, ``broadcast``, ``aggregate``, and
``evaluate_server`` (the server's model on the balanced global test set).
Everything random comes from generators derived from the run seed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from hetfed.config import PrivacyConfig, TrainConfig
from hetfed.engine.local import LocalSchedule
from hetfed.engine.types import (
    Broadcast,
    ClientData,
    ClientState,
    Params,
    ServerState,
    Upload,
    split_state,
)
from hetfed.models.base import Model

__all__ = [
    "Algorithm", "Broadcast", "Capabilities", "ClientData", "ClientEvalData", "ClientState", "Context", "Params", "Predictor",
    "ServerState", "Upload", "client_scores", "predict",
]


@dataclass(frozen=True)
class Capabilities:
    """What an algorithm does that the rest of hetfed must know — declared in its registry entry
    (:mod:`hetfed.algorithms.registry`), never inferred from its name.

    uploads: in words, what leaves a client each round (the privacy table of docs/methods.md).
    private: DP-FedAvg can privatise it: the uploads are only shared parameters (+ the training loss).
    server_data: the server needs unlabeled data of its own (``server_data.*``).
    whole_round: the server needs every update of a round at once (no streaming aggregation).
    server_model: the server holds a model: the server pipeline (robust combine, DP, server optimiser) applies.
    views: named predictors the clients evaluate after personalisation (empty: only the model).
    federated_view: which view is the federated phase's model.
    primary_view: which view is the method's headline result (None: the federated model).
    personalises: each client ends with a model of its own.
    model_kinds: the model kinds it supports (None: every kind).
    model_reason: why other kinds are refused (the error message's reason).
    """

    uploads: str = "shared parameters, sample count, training loss"
    private: bool = False
    server_data: bool = False
    whole_round: bool = False
    server_model: bool = True
    views: tuple[str, ...] = ()
    federated_view: str = "fedavg"
    primary_view: str | None = None
    personalises: bool = False
    model_kinds: tuple[str, ...] | None = None
    model_reason: str = ""


@dataclass(frozen=True, eq=False)
class Context:
    """What an algorithm is built with besides its model, schedule and parameters.

    pipeline: the server chain (:class:`hetfed.server.chain.Chain`: screen spec, combine or DP-FedAvg's
    noised mean, server optimiser), built from ``server.*`` and ``privacy`` by
    :func:`hetfed.algorithms.build_algorithm`; seed: the run seed (for per-client phases
    that draw from it); in_features: the flattened input size (a server model that
    decodes to inputs, Fed-FSNet's); build: a model of the same kind with n outputs
    (FedMoE's gate).
    """

    pipeline: Any = None
    seed: int = 0
    in_features: int | None = None
    build: Callable[[int], Model] | None = None


@dataclass(frozen=True, eq=False)
class ClientEvalData:
    """What a stack of clients evaluates on: its own validation and test sets.

    The balanced global test set is public (the dataset's own test split); a
    personalised model is also scored on it *by the client*, since only the
    client holds its personal parameters.
    """

    client_ids: list[int]
    x: torch.Tensor  # the train pool on the device (clients' val/test indices point into it)
    y: torch.Tensor
    test: list[np.ndarray]
    val: list[np.ndarray]
    x_global: torch.Tensor
    y_global: torch.Tensor
    n_classes: int
    #: which clients score the global test set with a personal model (None: all); the others report NaN
    global_mask: list[bool] | None = None
    #: per client, its training indices into the pool (methods that adapt before they predict: Per-FedAvg)
    train: list[np.ndarray] | None = None


@dataclass(frozen=True, eq=False)
class Predictor:
    """A model and the stacked parameters each client predicts with."""

    model: Model
    params: Params
    personalised: bool  # True when the clients' parameters differ (scored on the global test set by each)


class Algorithm:
    """Base class with FedAvg's server side; subclasses change what they need.

    What an algorithm *is* (its name, parameters, capabilities) is its registered
    :class:`~hetfed.algorithms.registry.AlgorithmSpec` (``spec``, set by ``register``);
    the class holds only behaviour.
    """

    #: set by :func:`hetfed.algorithms.registry.register`
    spec = None
    #: client-level differential privacy (``privacy.*``; None or noise_multiplier None: off)
    privacy: PrivacyConfig | None = None

    def __init__(self, model: Model, train: TrainConfig, params=None, context: Context | None = None):
        self.model = model
        self.train = train
        self.params = params if params is not None or self.spec is None else self.spec.make_params(None)
        self.context = context or Context()
        self.schedule = LocalSchedule.from_train(train)
        self._seed = 0
        self._expected_clients = 1

    @property
    def name(self) -> str:
        return self.spec.name if self.spec is not None else type(self).__name__.lower()

    @property
    def capabilities(self) -> Capabilities:
        return self.spec.capabilities if self.spec is not None else Capabilities()

    @property
    def has_global_model(self) -> bool:
        """True when the server keeps a model that can be evaluated on its own."""
        return self.capabilities.server_model

    @property
    def views(self) -> tuple[str, ...]:
        """Named predictors a client evaluates after :meth:`personalise` (empty: only the model)."""
        return self.capabilities.views

    @property
    def federated_view(self) -> str:
        """The name the federated phase is reported under when there are views."""
        return self.capabilities.federated_view

    @property
    def needs_all_updates(self) -> bool:
        """True when the server needs every client's update of a round at once: no streaming."""
        return self.capabilities.whole_round

    @property
    def personalised(self) -> bool:
        """True when clients predict with parameters of their own (the model's local ones)."""
        return bool(self.model.local_names)

    @property
    def personalises(self) -> bool:
        """True when the algorithm has a client-side step after federated training."""
        return type(self).personalise is not Algorithm.personalise

    # -- server side
    def bind(self, fed, seed: int = 0, per_round: int = 1) -> None:
        """Learn what the server may know before round 1: the federation (its size), the run seed and
        how many clients a round samples (``per_round``: DP's fixed denominator).

        Subclasses that learn more call this first.
        """
        self._seed = seed
        self._expected_clients = max(1, per_round)

    @property
    def dp(self) -> bool:
        return self.privacy is not None and self.privacy.noise_multiplier is not None

    def server_step(self, state: ServerState, upload: Upload, scale: float = 1.0) -> tuple[Params, dict]:
        """The server pipeline on a round's updates: ``(new shared params, server extra)``.

        The method's server chain (:mod:`hetfed.server.chain`: combine, or DP-FedAvg's noised mean under
        ``privacy``, then the server optimiser on the pseudo-gradient). Every algorithm whose server holds
        a model calls this, so robust rules, DP and server optimisers serve all of them alike. The chain's
        state goes into the returned extra (and so into checkpoints). ``scale`` multiplies the
        pseudo-gradient before the optimiser (FedNova's τ_eff).
        """
        chain = self.context.pipeline
        if chain is None:
            raise RuntimeError(f"{self.name}: no server chain; build algorithms with "
                               "hetfed.algorithms.build_algorithm (or pass context=Context(pipeline=…))")
        if self.dp:  # DP-FedAvg's noised mean in the combine step's place
            chain = chain.private(self.privacy)
        params, chain_state = chain.step(state.params, upload, chain.state_of(state.extra), round=state.round,
                                         seed=self._seed, expected_clients=self._expected_clients, scale=scale)
        extra = {k: v for k, v in state.extra.items() if k != chain.LEGACY_STATE}
        if chain_state:
            extra[chain.STATE] = chain_state
        return params, extra

    def server_init(self, gen: torch.Generator) -> ServerState:
        return ServerState(params=self.model.init_shared(gen))

    def select_clients(self, state: ServerState, eligible: np.ndarray, m: int,
                       rng: np.random.Generator) -> list[int] | None:
        """The round's m clients among the ``eligible`` ids, when the method chooses them (AFL);
        None: the engine's uniform sampling. ``rng`` is the round's sampling stream."""
        return None

    def broadcast(self, state: ServerState, round: int) -> Broadcast:
        lr = self.train.optimizer.lr * self.train.lr_decay**round
        return Broadcast(params=state.params, round=round, lr=lr)

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        """FedAvg: the server pipeline (sample-weighted mean, or the configured robust / private rule, then
        the server optimiser)."""
        params, extra = self.server_step(state, upload)
        return ServerState(params=params, round=state.round + 1, extra=extra)

    @torch.no_grad()
    def evaluate_server(self, state: ServerState, x_global: torch.Tensor, y_global: torch.Tensor) -> dict[str, float]:
        """The server's model on the balanced global test set (local parameters as for an unseen client)."""
        if not self.has_global_model:
            return {}
        logits = self.model.forward(self.global_params(state), x_global.unsqueeze(0), None)[0]
        s = _scores(logits, y_global)
        key = "server" if self.personalised else "global"
        out = {f"{key}_accuracy": s["accuracy"], f"{key}_loss": s["loss"]}
        if self.model.n_classes == 2:
            out[f"{key}_auc"] = _auc(y_global.cpu().numpy(), logits.softmax(-1)[:, 1].cpu().numpy())
        return out

    # -- client side
    def client_init(self, client_id: int, gen: torch.Generator) -> ClientState:
        return self.model.init_local(gen)

    def local_update(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[Upload, ClientState]:
        raise NotImplementedError

    def personalise(self, bc: Broadcast, states: ClientState, data: ClientData) -> tuple[ClientState, dict[str, torch.Tensor]]:
        """Client-side work after federated training; returns new states and per-client info metrics."""
        return states, {}

    def personalise_clients(self, fed, seed: int) -> list[int]:
        """Which clients run :meth:`personalise` (default: every client)."""
        return list(range(fed.n_clients))

    def eval_clients(self, fed, seed: int) -> list[int] | None:
        """Which clients report metrics (None: every client)."""
        return None

    def personalise_footprint(self) -> tuple[Model, int]:
        """The model and batch size :meth:`personalise` trains (for the executor's memory budget)."""
        return self.model, self.schedule.batch_size

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        """What each of ``n`` stacked clients predicts with (``view``: one of :attr:`views`)."""
        shared = bc.stacked(n)
        local, _ = split_state(states)
        return Predictor(self.model, {**shared, **local}, self.personalised)

    @torch.no_grad()
    def evaluate_client(self, bc: Broadcast, states: ClientState, data: ClientEvalData,
                        view: str | None = None) -> dict[str, list[float]]:
        """Each client's model on its own test and validation sets (and, if personal, the global test set)."""
        pred = self.predictor(bc, states, len(data.client_ids), view)
        return client_scores(pred, data)

    def global_params(self, state: ServerState) -> Params:
        """Stacked (n = 1) params of the server's model, for the global test set.

        Local parameters take their value for a client never seen in training.
        """
        unseen = {k: v.to(_device(state.params)) for k, v in self.model.local_for_unseen_client().items()}
        return {k: v.unsqueeze(0) for k, v in {**state.params, **unseen}.items()}


def _device(params: Params) -> torch.device:
    return next(iter(params.values())).device if params else torch.device("cpu")


# ------------------------------------------------------------------ scoring helpers


def size_blocks(sizes: np.ndarray, waste: float = 2.0) -> list[np.ndarray]:
    """Clients grouped by size so that padding each group to its largest costs at most ``waste`` × its samples.

    Clients of a natural federation differ by 100× (Shakespeare's roles: 12 to 6 667 windows); padded
    to the largest in one stack, scoring them computed ~10× the samples there are.
    """
    order = np.argsort(sizes, kind="stable")
    blocks, current, total = [], [], 0
    for k in order:
        size = int(sizes[k])
        if current and (len(current) + 1) * size > waste * (total + size):  # sorted: size is the block's width
            blocks.append(np.array(current))
            current, total = [], 0
        current.append(int(k))
        total += size
    if current:
        blocks.append(np.array(current))
    return blocks


@torch.no_grad()
def predict(model: Model, params: Params, x: torch.Tensor, index: list[np.ndarray]) -> list[torch.Tensor]:
    """Logits of each stacked model on its own index set → list of tensors.

    Clients of similar sizes are stacked and padded together (:func:`size_blocks`), so unequal
    clients do not all pay for the largest.
    """
    n = len(index)
    if max((len(i) for i in index), default=0) == 0:
        return [torch.zeros(0, model.n_classes) for _ in index]
    out: list[torch.Tensor | None] = [None] * n
    for block in size_blocks(np.array([len(i) for i in index])):
        width = max(len(index[k]) for k in block)
        pad = np.zeros((len(block), width), dtype=np.int64)
        for row, k in enumerate(block):
            pad[row, : len(index[k])] = index[k]
        sub = params if np.array_equal(block, np.arange(n)) else {
            name: v[torch.as_tensor(block, device=v.device)] for name, v in params.items()}
        logits = model.forward(sub, x[torch.as_tensor(pad, device=x.device)], None)
        for row, k in enumerate(block):
            out[k] = logits[row, : len(index[k])]
    return out  # type: ignore[return-value]


def _scores(logits: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    if len(y) == 0:
        return {"accuracy": float("nan"), "loss": float("nan"), "loss_sum": 0.0, "n": 0}
    loss = F.cross_entropy(logits, y, reduction="sum").item()
    correct = (logits.argmax(-1) == y).sum().item()
    return {"accuracy": correct / len(y), "loss_sum": loss, "loss": loss / len(y), "n": len(y)}


def _auc(y: np.ndarray, score: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    if len(np.unique(y)) < 2:
        return float("nan")
    return float(roc_auc_score(y, score))


#: at most this many input floats in one block of personal models scoring the global test set
GLOBAL_BLOCK_FLOATS = 50_000_000


@torch.no_grad()
def client_scores(pred: Predictor, data: ClientEvalData) -> dict[str, list]:
    """Per-client metrics of a stack: local test accuracy/loss, validation loss sums, AUC, global test set.

    A personalised model's global-test accuracy is also split by the client's own
    classes and the others (``global_accuracy_own`` / ``_other``, see
    :func:`own_class_masks`). Only these numbers leave a client. ``val_loss_sum``/``val_n`` let the server
    pool validation losses weighted by size; ``global_probs`` (binary tasks,
    personalised models) lets it compute the AUC of the clients' mean prediction
    on the public global test set.
    """
    binary = data.n_classes == 2
    tests = predict(pred.model, pred.params, data.x, data.test)
    vals = predict(pred.model, pred.params, data.x, data.val)
    out: dict[str, list] = {"local_accuracy": [], "local_loss": [], "local_n": [], "val_loss": [], "val_accuracy": [],
                            "val_loss_sum": [], "val_n": []}
    if binary:
        out["local_auc"] = []
    for j in range(len(data.client_ids)):
        yt = data.y[torch.as_tensor(data.test[j], device=data.y.device)]
        s = _scores(tests[j], yt)
        out["local_accuracy"].append(s["accuracy"])
        out["local_loss"].append(s["loss"])
        out["local_n"].append(s["n"])
        if binary:
            out["local_auc"].append(_auc(yt.cpu().numpy(), tests[j].softmax(-1)[:, 1].cpu().numpy()) if len(yt) else float("nan"))
        yv = data.y[torch.as_tensor(data.val[j], device=data.y.device)]
        v = _scores(vals[j], yv)
        out["val_loss"].append(v["loss"])
        out["val_accuracy"].append(v["accuracy"])
        out["val_loss_sum"].append(v["loss_sum"])
        out["val_n"].append(v["n"])
    if pred.personalised:
        n = len(data.client_ids)
        mask = data.global_mask if data.global_mask is not None else [True] * n
        rows = [j for j in range(n) if mask[j]]
        out["global_accuracy"], out["global_loss"] = [float("nan")] * n, [float("nan")] * n
        own = own_class_masks(data)
        if own is not None:
            out["global_accuracy_own"], out["global_accuracy_other"] = [float("nan")] * n, [float("nan")] * n
        if binary:
            out["global_probs"] = [None] * n
        full = np.arange(len(data.y_global))
        width = max(int(np.prod(data.x_global.shape[1:])), data.n_classes)
        block = max(1, GLOBAL_BLOCK_FLOATS // max(len(full) * width, 1))
        for start in range(0, len(rows), block):  # a full pass over the global test set per client: in blocks
            part = rows[start : start + block]
            sub = pred.params if len(part) == n else {
                k: v[torch.as_tensor(part, device=v.device)] for k, v in pred.params.items()}
            glob = predict(pred.model, sub, data.x_global, [full] * len(part))
            for j, logits in zip(part, glob, strict=True):
                s = _scores(logits, data.y_global)
                out["global_accuracy"][j] = s["accuracy"]
                out["global_loss"][j] = s["loss"]
                if binary:
                    out["global_probs"][j] = logits.softmax(-1)
                if own is not None:
                    hit = (logits.argmax(-1) == data.y_global).double()
                    out["global_accuracy_own"][j] = masked_mean(hit, own[j])
                    out["global_accuracy_other"][j] = masked_mean(hit, ~own[j])
    return out


def own_class_masks(data: ClientEvalData) -> list[torch.Tensor] | None:
    """Per client, which global test samples are of its *own* classes: those whose share of the
    client's training labels is above uniform (1/C). None when the training indices are not known.

    Why: a personalised model is scored on the balanced global test set to see what it
    kept of the federation's knowledge; the classes a client rarely sees are where
    personalisation forgets (fine-tuning) or must route to the global model (FedMoE's gate).
    """
    if data.train is None:
        return None
    masks = []
    for idx in data.train:
        labels = data.y[torch.as_tensor(idx, device=data.y.device)]
        share = torch.bincount(labels, minlength=data.n_classes).double() / max(len(idx), 1)
        own = torch.nonzero(share > 1.0 / data.n_classes).flatten()
        masks.append(torch.isin(data.y_global, own))
    return masks


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """The mean of ``values`` where ``mask`` holds; NaN where it never does."""
    return float(values[mask].mean()) if bool(mask.any()) else float("nan")


class Stopwatch:
    """Seconds spent, for the per-client ``info`` a personalisation step reports."""

    def __init__(self) -> None:
        self.t0 = time.perf_counter()

    def seconds(self) -> float:
        return time.perf_counter() - self.t0
