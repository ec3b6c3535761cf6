"""FedMoE (Listo Zec, Mogren et al., "Specialized federated learning using a mixture of experts").

1. FedAvg on the **opt-in** clients only (opted-out clients are never sampled),
   keeping the best global model by validation loss, with early stopping — the
   federated rounds, run by the executor like any other algorithm's.
2. Every client — opted in or not — initialises a *specialist* from the global
   model and fine-tunes it on its own data ("Fine-tuned").
3. Every client trains its specialist and a gate jointly through the mixture
   ``h·f_s + (1 − h)·f_g``, the global model frozen in evaluation mode ("Mixture").

Plus the "Local" baseline: a model trained from scratch on the client's data.
Steps 2–3 and Local are the algorithm's client-side :meth:`FedMoE.personalise`
step: the executor runs it for a stack of clients (one, a chunk, or — on Flower —
the client on its own SuperNode) after federated training, from the best global
model. Specialists and gates are local state: nothing of steps 2–3 leaves a
client but the epochs it trained. The four models are then reported as four
*views* (``local``, ``fedavg``, ``finetuned``, ``mixture``), each scored by the
clients on their own data.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import numpy as np
import torch
from pydantic import Field, model_validator

from hetfed.algorithms.fedavg import FedAvg
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.config import OptimizerConfig, TrainConfig
from hetfed.engine import optim
from hetfed.engine.evaluate import (
    ClientEvalData,
    Predictor,
    client_losses,
    masked_mean,
    own_class_masks,
)
from hetfed.engine.local import LocalSchedule, train_stack
from hetfed.engine.rng import CLIENT_INIT, derive_seed, numpy_rng, torch_gen
from hetfed.engine.types import Broadcast, ClientData, ClientState, Params, index_on
from hetfed.interface import PersonalPlan
from hetfed.models.base import Model, under, without
from hetfed.models.mixture import Mixture

PERSONAL = 11  # rng purpose: personalisation phases
METHODS = ("local", "fedavg", "finetuned", "mixture")
PHASES = ("local", "finetuned", "mixture")


class FedMoEParams(AlgorithmParams):
    """FedMoE's per-client phases: fine-tuning, then specialist + gate (and the Local baseline).

    Each phase trains every client for at most ``max_epochs`` epochs and keeps,
    per client, the parameters with the lowest validation loss; a client stops
    once it has not improved for ``patience`` epochs.
    """

    max_epochs: int = Field(100, ge=1)
    patience: int = Field(10, ge=1)
    batch_size: int = Field(32, ge=1)
    optimizer: OptimizerConfig = Field(default_factory=lambda: OptimizerConfig(kind="adam", lr=1e-3, momentum=0.0))
    local_optimizer: OptimizerConfig | None = Field(
        None, description="the Local baseline's optimiser when it differs from the fine-tuning/mixture one (the "
        "paper: Adam 5e-5 for FedAvg and Local, 1e-5 for fine-tuning and the mixture); default: optimizer")
    blend: Literal["prob", "log"] = Field("prob", description="mix probabilities (paper) or logits (authors' code)")
    eval_clients: int | None = Field(None, ge=1, description="evaluate a random sample of clients (paper: 20)")
    personalise: Literal["all", "evaluated"] = Field(
        "all",
        description="which clients run Local, fine-tuning and the mixture: all (the method) or only the "
        "evaluated sample (the same numbers for them, a fraction of the cost)",
    )

    @model_validator(mode="before")
    @classmethod
    def _local_onto_optimizer(cls, data: Any) -> Any:
        """``local_optimizer`` given in part keeps the rest of ``optimizer`` (its default): ``{lr: 5e-5}`` is the
        paper's Adam at 5e-5, not SGD."""
        if not isinstance(data, dict) or not isinstance(data.get("local_optimizer"), dict):
            return data
        given = data.get("optimizer", {})
        base = {**cls.model_fields["optimizer"].get_default(call_default_factory=True).model_dump(),
                **(given.model_dump() if isinstance(given, OptimizerConfig) else dict(given))}
        return {**data, "local_optimizer": {**base, **data["local_optimizer"]}}


def _stack(params: Params, n: int) -> Params:
    return {k: v.unsqueeze(0).expand(n, *v.shape).contiguous() for k, v in params.items()}


def train_until_stopped(
    model: Model,
    params: Params,
    data: ClientData,
    cfg: FedMoEParams,
    seed: int,
    phase: int,
    trainable: list[str] | None = None,
    like: LocalSchedule | None = None,
) -> tuple[Params, list[int]]:
    """Train stacked per-client params epoch by epoch, each client with its own early stopping.

    A client stops once its validation loss has not improved for
    ``cfg.patience`` epochs (or at ``cfg.max_epochs``) and keeps its best
    parameters; stopped clients leave the stack, so a client's result does not
    depend on which clients it was stacked with (the sequential executor,
    any chunk size, and training only a sample of clients all agree).
    Returns the best params and the epochs each client ran. ``like``: the run's schedule, whose capture the epochs
    are recorded with (:meth:`~hetfed.engine.local.LocalSchedule.extra_pass`).
    """
    clients, x, y = data.client_ids, data.x, data.y
    val = data.val_indices if data.val_indices is not None else [np.zeros(0, np.int64) for _ in clients]
    names = trainable if trainable is not None else list(params)
    schedule = (like or LocalSchedule(cfg.batch_size)).extra_pass(cfg.batch_size)
    n = len(clients)
    best = {k: v.clone() for k, v in params.items()}
    best_val = client_losses(model, params, x, y, val)
    since = torch.zeros(n, dtype=torch.long, device=x.device)
    epochs = [0] * n
    state = optim.init_state(cfg.optimizer, {k: params[k] for k in names})
    running = list(range(n))
    for epoch in range(cfg.max_epochs):
        sub = [clients[i] for i in running]
        rows = index_on(running, x.device)
        step_data = ClientData(
            sub, x, y, [data.indices[i] for i in running],
            [derive_seed(seed, PERSONAL, phase, epoch, k) for k in sub],
        )
        p_out, s_out, _ = train_stack(
            model, {k: v[rows] for k, v in params.items()}, step_data, schedule, cfg.optimizer, cfg.optimizer.lr,
            {k: v[rows] for k, v in state.items()}, trainable=names,
        )
        params = {k: v.index_copy(0, rows, p_out[k]) for k, v in params.items()}
        state = {k: v.index_copy(0, rows, s_out[k]) for k, v in state.items()}
        for i in running:
            epochs[i] = epoch + 1
        v_now = client_losses(model, p_out, x, y, [val[i] for i in running])
        improved = v_now < best_val[rows]
        for k in best:
            mask = improved.view(-1, *([1] * (best[k].ndim - 1)))
            best[k][rows] = torch.where(mask, p_out[k], best[k][rows])
        best_val[rows] = torch.where(improved, v_now, best_val[rows])
        since[rows] = torch.where(improved, torch.zeros_like(since[rows]), since[rows] + 1)
        running = [i for i in running if int(since[i]) < cfg.patience]
        if not running:
            break
    return best, epochs


class FedMoE(FedAvg):
    """FedAvg's rounds, then per-client Local, Fine-tuned and Mixture models (see the module docstring)."""

    def __init__(self, model: Model, train: TrainConfig, params: FedMoEParams | None = None, context=None):
        super().__init__(model, train, params, context)
        if self.context.build is None:
            raise ValueError("fedmoe needs context.build (the model factory its gate is made with)")
        self.moe = self.params
        self.seed = self.context.seed
        self.mixture = Mixture(self.context.build, model.n_classes, self.moe.blend)

    # -- which clients
    def personal_plan(self, fed: Any, seed: int) -> PersonalPlan:
        """Scored: a random sample of ``moe.eval_clients`` (the paper's 20), or every client; personalised:
        every client (the method), or only the scored ones (per-client phases give them the same models); it
        trains the mixture with FedMoE's own batch size."""
        every = list(range(fed.n_clients))
        n = self.moe.eval_clients
        scored = (sorted(numpy_rng(seed, PERSONAL, 0).choice(fed.n_clients, n, replace=False).tolist())
                  if n is not None and n < fed.n_clients else None)
        clients = (scored or every) if self.moe.personalise == "evaluated" else every
        return PersonalPlan(clients, scored, self.mixture, self.moe.batch_size)

    # -- the client-side step after federated training
    def personalise(self, bc: Broadcast, states: ClientState,
                    data: ClientData) -> tuple[ClientState, dict[str, torch.Tensor]]:
        clients = data.client_ids
        n = len(clients)
        device = data.x.device
        base, cfg, seed, like = self.model, self.moe, self.seed, self.schedule
        info: dict[str, torch.Tensor] = {}
        out = dict(states)

        def record(phase: str, best: Params, epochs: list[int], t0: float) -> None:
            out.update({f"{phase}.{k}": v for k, v in best.items()})
            info[f"epochs.{phase}"] = torch.tensor(epochs, dtype=torch.float64)
            info[f"seconds.{phase}"] = torch.full((n,), (time.perf_counter() - t0) / n, dtype=torch.float64)

        # Local: from scratch, on the client's own data
        t0 = time.perf_counter()
        init = [base.init_shared(torch_gen(seed, CLIENT_INIT, PERSONAL, k)) for k in clients]
        stacked = {k: torch.stack([p[k] for p in init]).to(device) for k in init[0]}
        local = cfg if cfg.local_optimizer is None else cfg.model_copy(update={"optimizer": cfg.local_optimizer})
        best, ep = train_until_stopped(base, stacked, data, local, seed, phase=1, like=like)
        record("local", best, ep, t0)

        # Fine-tuned: specialist = the global model, trained on the client's data
        t0 = time.perf_counter()
        best, ep = train_until_stopped(base, _stack(bc.params, n), data, cfg, seed, phase=2, like=like)
        record("finetuned", best, ep, t0)

        # Mixture: specialist + gate trained jointly, the global expert frozen
        t0 = time.perf_counter()
        gates = [self.mixture.gate.init_shared(torch_gen(seed, CLIENT_INIT, PERSONAL + 1, k)) for k in clients]
        mixed = {f"global.{k}": v for k, v in _stack(bc.params, n).items()}
        mixed.update({f"specialist.{k}": out[f"finetuned.{k}"] for k in bc.params})
        mixed.update({f"gate.{k}": torch.stack([g[k] for g in gates]).to(device) for k in gates[0]})
        trainable = [s.name for s in self.mixture.specs() if not s.name.startswith("global.")]
        best, ep = train_until_stopped(self.mixture, mixed, data, cfg, seed, phase=3, trainable=trainable,
                                       like=like)
        record("mixture", without(best, "global."), ep, t0)
        return out, info

    @torch.no_grad()
    def evaluate_client(self, bc: Broadcast, states: ClientState, data: ClientEvalData,
                        view: str | None = None) -> dict[str, list[float]]:
        """The scores every view reports; the mixture also reports its gate's mean weight on the specialist,
        ``h``, over the global test samples of the client's own classes and of the others (``gate_own``,
        ``gate_other``): the paper's case for the mixture is that ``h`` falls where the client lacks data."""
        out = super().evaluate_client(bc, states, data, view)
        own = own_class_masks(data) if view == "mixture" else None
        if own is not None:
            params = self.predictor(bc, states, len(data.client_ids), view).params
            out["mean.gate_own"], out["mean.gate_other"] = [], []
            for j, mask in enumerate(own):
                h = self.mixture.gate_value({k: v[j : j + 1] for k, v in params.items()}, data.x_global.unsqueeze(0))
                h = h[0, :, 0].double()
                out["mean.gate_own"].append(masked_mean(h, mask))
                out["mean.gate_other"].append(masked_mean(h, ~mask))
        return out

    def predictor(self, bc: Broadcast, states: ClientState, n: int, view: str | None = None) -> Predictor:
        if view in (None, self.capabilities.federated_view):
            return super().predictor(bc, states, n, None)
        shared = bc.stacked(n)
        if view in ("local", "finetuned"):
            return Predictor(self.model, under(states, view + "."), True)
        if view == "mixture":
            own = under(states, "mixture.")
            return Predictor(self.mixture, {**{f"global.{k}": v for k, v in shared.items()}, **own}, True)
        raise ValueError(f"FedMoE has no view {view!r}: expected one of {METHODS}")


register(AlgorithmSpec(
    "fedmoe", FedMoE, "FedAvg, then per client a gated mixture of the frozen global model and a fine-tuned "
    "specialist (and the Local and Fine-tuned baselines); clients may opt out",
    "Listo Zec, Mogren et al., Specialized Federated Learning using a Mixture of Experts", FedMoEParams,
    Capabilities(private=True, views=METHODS, federated_view="fedavg", primary_view="mixture", personalises=True,
                 stacks_runs=True,
                 uploads="shared parameters, sample count, training loss (federated phase); after it, only the "
                 "epochs and seconds each personal phase took"),
    legacy_section="moe", quick={"max_epochs": 3, "patience": 2},
    privacy=(
        PrivacyRow(
            method="FedMoE, federated phase",
            config="`algorithm: fedmoe`",
            params="shared parameters (opted-in clients only; opted-out clients send nothing at all)",
            extra="`train_loss`",
            stays="specialist, gate, the client's copy of the global model",
        ),
    ),
    family="personalised", venue="arXiv 2020",
))
