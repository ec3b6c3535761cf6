"""The round loop: sample → broadcast → local_update → aggregate → evaluate.

``simulate`` is a generator-free, callback-driven loop: the runner passes
``on_eval`` to stream metrics to disk as they come, so an interrupted run keeps
every evaluation it finished.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from hetfed.algorithms.base import Algorithm
from hetfed.config import TrainConfig
from hetfed.engine.evaluate import Evaluation, evaluate
from hetfed.engine.executors import Executor, Pool, build_executor
from hetfed.engine.rng import CLIENT_INIT, SERVER_INIT, torch_gen
from hetfed.engine.sampling import sample_clients
from hetfed.engine.types import ClientState, ServerState
from hetfed.errors import RunError


def resolve_device(kind: str) -> torch.device:
    if kind == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if kind == "cuda" and not torch.cuda.is_available():
        from hetfed.errors import ConfigError

        raise ConfigError("train.device = 'cuda' is not allowed here: no CUDA device; expected 'cpu' or 'auto'")
    return torch.device(kind)


@dataclass
class SimulationResult:
    server: ServerState
    states: dict[int, ClientState]
    history: list[tuple[int, Evaluation]] = field(default_factory=list)
    best_round: int | None = None
    best: Evaluation | None = None
    best_server: ServerState | None = None
    rounds_done: int = 0
    stopped_early: bool = False
    selected_by: str | None = "val_loss"  # None: no validation data, so best = final
    train_seconds: float = 0.0
    server_seconds: float = 0.0  # the aggregate step's share of train_seconds


class DivergedError(RunError):
    """Training produced non-finite parameters or losses: nothing after it is meaningful."""


def _diverged(rnd: int, train: TrainConfig, what: str) -> str:
    return (f"training diverged at round {rnd}: {what}; earlier evaluations are kept in "
            f"metrics.csv. Expected a smaller train.optimizer.lr (now {train.optimizer.lr:g}) or "
            "train.server_lr, or standardised features")


def _check_finite(server: ServerState, rnd: int, train: TrainConfig) -> None:
    bad = [k for k, v in server.params.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
    if bad:
        raise DivergedError(_diverged(rnd, train, f"the global parameters {bad[:3]} hold NaN or infinite values"))


def _to(params: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in params.items()}


def simulate(
    algo: Algorithm,
    fed,
    train: TrainConfig,
    seed: int,
    executor: Executor | None = None,
    on_round: Callable[[int, dict[str, float] | None], None] | None = None,
    on_eval: Callable[[int, Evaluation], None] | None = None,
) -> SimulationResult:
    """Run ``train.rounds`` rounds of ``algo`` on the federation ``fed``."""
    device = resolve_device(train.device)
    executor = executor or build_executor(train.executor, train.memory_budget_mb, train.chunk_clients)
    x = torch.as_tensor(np.asarray(fed.x, dtype=np.float32), device=device)
    y = torch.as_tensor(np.asarray(fed.y, dtype=np.int64), device=device)
    xg = torch.as_tensor(np.asarray(fed.x_global_test, dtype=np.float32), device=device)
    yg = torch.as_tensor(np.asarray(fed.y_global_test, dtype=np.int64), device=device)
    pool = Pool(x, y, fed.train, seed)

    server = algo.server_init(torch_gen(seed, SERVER_INIT))
    server = ServerState(_to(server.params, device), server.round, server.extra)
    states = {k: _to(algo.client_init(k, torch_gen(seed, CLIENT_INIT, k)), device) for k in range(fed.n_clients)}
    result = SimulationResult(server, states)
    # best-model selection needs validation data on the clients that train the global model
    has_val = any(len(fed.val[k]) for k in np.flatnonzero(~np.asarray(fed.opted_out, dtype=bool)))
    result.selected_by = "val_loss" if has_val else None
    best_val = float("inf")
    since_best = 0
    t_train = 0.0
    for r in range(train.rounds):
        t0 = time.perf_counter()
        clients = sample_clients(train, fed.opted_out, seed, r)
        bc = algo.broadcast(server, r)
        upload, new_states = executor.run(algo, bc, clients, states, pool)
        states = {**states, **new_states}
        t_server = time.perf_counter()
        server = algo.aggregate(server, upload)
        result.server_seconds += time.perf_counter() - t_server
        _check_finite(server, r + 1, train)
        t_train += time.perf_counter() - t0
        result.rounds_done = r + 1
        metrics = None
        if (r + 1) % train.eval_every == 0 or r + 1 == train.rounds:
            ev = evaluate(algo, server, states, fed, x, y, xg, yg)
            metrics = ev.metrics
            result.history.append((r + 1, ev))
            if on_eval:
                on_eval(r + 1, ev)
            val = ev.metrics["val_loss"]
            if has_val and not np.isfinite(val):
                raise DivergedError(_diverged(r + 1, train, "the validation loss is not finite"))
            if not has_val or val < best_val:  # without validation data, best = the latest
                best_val = val if has_val else best_val
                result.best_round, result.best = r + 1, ev
                result.best_server = ServerState(copy.deepcopy(server.params), server.round)
                since_best = 0
            else:
                since_best += 1
        if on_round:
            on_round(r + 1, metrics)
        if train.patience is not None and since_best >= train.patience:
            result.stopped_early = True
            break
    result.server, result.states, result.train_seconds = server, states, t_train
    return result
