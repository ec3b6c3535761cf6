"""FedMoE (Listo Zec, Mogren et al., "Specialized federated learning using a mixture of experts").

1. FedAvg on the **opt-in** clients only (opted-out clients are never sampled),
   keeping the best global model by validation loss, with early stopping.
2. Every client — opted in or not — initialises a *specialist* from the global
   model and fine-tunes it on its own data ("Fine-tuned").
3. Every client trains its specialist and a gate jointly through the mixture
   ``h·f_s + (1 − h)·f_g``, the global model frozen in evaluation mode ("Mixture").

Plus the "Local" baseline: a model trained from scratch on the client's data.
Steps 2–3 and Local are independent per client, so they run for all clients at
once, stacked along the client axis (chunked to the memory budget), through
the same ``train_stack`` as federated training. Specialists and gates are local:
nothing of steps 2–3 leaves a client.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from hetfed.algorithms.fedavg import FedAvg, Local
from hetfed.config import Config, MoEConfig, TrainConfig
from hetfed.engine import optim
from hetfed.engine.evaluate import Evaluation, evaluate, predict
from hetfed.engine.executors import VectorisedExecutor
from hetfed.engine.local import LocalSchedule, train_stack
from hetfed.engine.rng import CLIENT_INIT, derive_seed, numpy_rng, torch_gen
from hetfed.engine.simulate import SimulationResult, resolve_device, simulate
from hetfed.engine.types import ClientData, Params, ServerState
from hetfed.models.base import Model
from hetfed.models.mixture import Mixture

PERSONAL = 11  # rng purpose: personalisation phases
METHODS = ("local", "fedavg", "finetuned", "mixture")


@dataclass
class PhaseTensors:
    x: torch.Tensor
    y: torch.Tensor
    xg: torch.Tensor
    yg: torch.Tensor


def _stack(params: Params, n: int) -> Params:
    return {k: v.unsqueeze(0).expand(n, *v.shape).contiguous() for k, v in params.items()}


@torch.no_grad()
def client_val_loss(model: Model, params: Params, fed, clients: list[int], t: PhaseTensors) -> torch.Tensor:
    """Mean validation cross-entropy of each stacked client model on its own val set."""
    logits = predict(model, params, t.x, [fed.val[k] for k in clients])
    out = []
    for k, lg in zip(clients, logits, strict=True):
        idx = torch.as_tensor(fed.val[k], device=t.y.device)
        out.append(F.cross_entropy(lg, t.y[idx]) if len(idx) else torch.tensor(0.0, device=t.y.device))
    return torch.stack(out)


def train_until_stopped(
    model: Model,
    params: Params,
    fed,
    clients: list[int],
    t: PhaseTensors,
    cfg: MoEConfig,
    seed: int,
    phase: int,
    trainable: list[str] | None = None,
) -> tuple[Params, list[int]]:
    """Train stacked per-client params epoch by epoch, each client with its own early stopping.

    A client stops once its validation loss has not improved for
    ``cfg.patience`` epochs (or at ``cfg.max_epochs``) and keeps its best
    parameters; stopped clients leave the stack, so a client's result does not
    depend on which clients it was stacked with (the sequential executor,
    any chunk size, and training only a sample of clients all agree).
    Returns the best params and the epochs each client ran.
    """
    names = trainable if trainable is not None else list(params)
    schedule = LocalSchedule(batch_size=cfg.batch_size, epochs=1.0)
    n = len(clients)
    best = {k: v.clone() for k, v in params.items()}
    best_val = client_val_loss(model, params, fed, clients, t)
    since = torch.zeros(n, dtype=torch.long, device=t.x.device)
    epochs = [0] * n
    state = optim.init_state(cfg.optimizer, {k: params[k] for k in names})
    running = list(range(n))
    for epoch in range(cfg.max_epochs):
        sub = [clients[i] for i in running]
        rows = torch.as_tensor(running, device=t.x.device)
        data = ClientData(
            sub, t.x, t.y, [fed.train[k] for k in sub],
            [derive_seed(seed, PERSONAL, phase, epoch, k) for k in sub],
        )
        p_out, s_out, _ = train_stack(
            model, {k: v[rows] for k, v in params.items()}, data, schedule, cfg.optimizer, cfg.optimizer.lr,
            {k: v[rows] for k, v in state.items()}, trainable=names,
        )
        params = {k: v.index_copy(0, rows, p_out[k]) for k, v in params.items()}
        state = {k: v.index_copy(0, rows, s_out[k]) for k, v in state.items()}
        for i in running:
            epochs[i] = epoch + 1
        val = client_val_loss(model, p_out, fed, sub, t)
        improved = val < best_val[rows]
        for k in best:
            mask = improved.view(-1, *([1] * (best[k].ndim - 1)))
            best[k][rows] = torch.where(mask, p_out[k], best[k][rows])
        best_val[rows] = torch.where(improved, val, best_val[rows])
        since[rows] = torch.where(improved, torch.zeros_like(since[rows]), since[rows] + 1)
        running = [i for i in running if int(since[i]) < cfg.patience]
        if not running:
            break
    return best, epochs


def _chunks(clients: list[int], size: int):
    for i in range(0, len(clients), size):
        yield clients[i : i + size]


def run_fedmoe(
    config: Config,
    train: TrainConfig,
    build: Callable[[int], Model],
    fed,
    on_round: Callable[[int, dict | None], None] | None = None,
    on_eval: Callable[[str, int, Evaluation], None] | None = None,
    on_phase: Callable[[str, int, int], None] | None = None,
) -> dict[str, dict]:
    """All four methods of the FedMoE paper on one federation; returns their summaries.

    ``on_phase(phase, clients_done, clients_total)`` reports the per-client phases' progress.
    """
    cfg = config.moe
    seed = config.seed
    device = resolve_device(train.device)
    n_classes = fed.n_classes
    base = build(n_classes)
    t = PhaseTensors(
        torch.as_tensor(np.asarray(fed.x, np.float32), device=device),
        torch.as_tensor(np.asarray(fed.y, np.int64), device=device),
        torch.as_tensor(np.asarray(fed.x_global_test, np.float32), device=device),
        torch.as_tensor(np.asarray(fed.y_global_test, np.int64), device=device),
    )
    every = list(range(fed.n_clients))
    if cfg.eval_clients is not None and cfg.eval_clients < fed.n_clients:
        evaluated = sorted(numpy_rng(seed, PERSONAL, 0).choice(fed.n_clients, cfg.eval_clients, replace=False).tolist())
    else:
        evaluated = every
    # steps 2–3 and Local are per client: training only the evaluated ones gives them the same models
    personalised = every if cfg.personalise == "all" else evaluated
    size = 1 if train.executor == "sequential" else VectorisedExecutor(train.memory_budget_mb, train.chunk_clients).chunk_size(
        _Sized(Mixture(build, n_classes), cfg.batch_size)
    )
    summaries: dict[str, dict] = {}

    # 1. FedAvg on the opted-in clients (the sampler never picks an opted-out one)
    t0 = time.perf_counter()
    fedavg = FedAvg(base, train)
    result: SimulationResult = simulate(
        fedavg, fed, train, seed, on_round=on_round,
        on_eval=(lambda r, ev: on_eval("fedavg", r, ev)) if on_eval else None,
    )
    global_params = (result.best_server or result.server).params
    # one global model: its global-test accuracy is computed once, not once per client
    fedavg_eval = evaluate(fedavg, ServerState(global_params), {k: {} for k in evaluated}, fed, t.x, t.y, t.xg, t.yg, clients=evaluated)
    summaries["fedavg"] = _summary(fedavg_eval,
                                   time.perf_counter() - t0, {"rounds": result.rounds_done, "best_round": result.best_round})
    summaries["fedavg"]["_global_params"] = global_params

    # Local: from scratch, on each client's own data
    t0 = time.perf_counter()
    local_params: dict[int, Params] = {}
    epochs_used = []
    for chunk in _chunks(personalised, size):
        init = [base.init_shared(torch_gen(seed, CLIENT_INIT, PERSONAL, k)) for k in chunk]
        stacked = {k: torch.stack([p[k] for p in init]).to(device) for k in init[0]}
        best, ep = train_until_stopped(base, stacked, fed, chunk, t, cfg, seed, phase=1)
        epochs_used.extend(ep)
        local_params.update({k: {n: v[i] for n, v in best.items()} for i, k in enumerate(chunk)})
        if on_phase:
            on_phase("local", len(local_params), len(personalised))
    summaries["local"] = _summary(_evaluate(base, local_params, fed, t, evaluated), time.perf_counter() - t0, _epochs(epochs_used))

    # 2. Fine-tuned: specialist = global model, trained on the client's data
    t0 = time.perf_counter()
    specialists: dict[int, Params] = {}
    epochs_used = []
    for chunk in _chunks(personalised, size):
        best, ep = train_until_stopped(base, _stack(global_params, len(chunk)), fed, chunk, t, cfg, seed, phase=2)
        epochs_used.extend(ep)
        specialists.update({k: {n: v[i] for n, v in best.items()} for i, k in enumerate(chunk)})
        if on_phase:
            on_phase("finetuned", len(specialists), len(personalised))
    summaries["finetuned"] = _summary(_evaluate(base, specialists, fed, t, evaluated), time.perf_counter() - t0, _epochs(epochs_used))

    # 3. Mixture: specialist + gate trained jointly, the global expert frozen
    t0 = time.perf_counter()
    mixture = Mixture(build, n_classes, cfg.blend)
    trainable = [s.name for s in mixture.specs() if not s.name.startswith("global.")]
    mixed: dict[int, Params] = {}
    epochs_used = []
    for chunk in _chunks(personalised, size):
        gates = [mixture.gate.init_shared(torch_gen(seed, CLIENT_INIT, PERSONAL + 1, k)) for k in chunk]
        stacked = {f"global.{n}": v for n, v in _stack(global_params, len(chunk)).items()}
        stacked.update({f"specialist.{n}": torch.stack([specialists[k][n] for k in chunk]) for n in global_params})
        stacked.update({f"gate.{n}": torch.stack([g[n] for g in gates]).to(device) for n in gates[0]})
        best, ep = train_until_stopped(mixture, stacked, fed, chunk, t, cfg, seed, phase=3, trainable=trainable)
        epochs_used.extend(ep)
        mixed.update({k: {n: v[i] for n, v in best.items()} for i, k in enumerate(chunk)})
        if on_phase:
            on_phase("mixture", len(mixed), len(personalised))
    summaries["mixture"] = _summary(_evaluate(mixture, mixed, fed, t, evaluated), time.perf_counter() - t0, _epochs(epochs_used))
    return {m: summaries[m] for m in METHODS}


def _epochs(per_client: list[int]) -> dict:
    return {"epochs": max(per_client), "epochs_mean": float(np.mean(per_client))}


class _Sized:
    """What the executor's memory estimate needs: a model and a batch size."""

    def __init__(self, model: Model, batch: int):
        self.model = model
        self.schedule = LocalSchedule(batch_size=batch)


def _evaluate(model: Model, params: dict[int, Params], fed, t: PhaseTensors, clients: list[int]) -> Evaluation:
    """Each client's own model on its local test set and on the global test set."""
    holder = Local(model, TrainConfig())
    return evaluate(holder, ServerState({}), params, fed, t.x, t.y, t.xg, t.yg, clients=clients)


def _summary(ev: Evaluation, seconds: float, extra: dict) -> dict:
    metrics = {k: (None if isinstance(v, float) and np.isnan(v) else float(v)) for k, v in ev.metrics.items()}
    return {
        "final": metrics,
        "best": metrics,
        "local_accuracy": metrics.get("local_accuracy_mean"),
        "global_accuracy": metrics.get("global_accuracy"),
        "wall_seconds": seconds,
        "seconds_per_round": seconds / max(extra.get("rounds") or extra.get("epochs") or 1, 1),
        "evaluation": ev,
        **extra,
    }
