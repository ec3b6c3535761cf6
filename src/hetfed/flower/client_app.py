"""The hetfed ``ClientApp``: one client per SuperNode, the same algorithm object as in-process.

Each SuperNode builds *its own* client's data from the run's config (sent in
every message; the node config's ``partition-id`` names the client), so a
Flower run trains on exactly the federation the simulator builds. The client's
local state — CGAU conditioning rows, kept optimiser state, FedMoE specialists
and gates — lives in the node's ``context.state`` across rounds and never
appears in a reply: replies carry only what :mod:`hetfed.flower.records` puts
there (shared parameters, the sample count, documented extras, metrics).

Message types: ``query`` (which client is this node? — and, once per run, its Γ
summary: count, Σx, Σxxᵀ of its own rows, optionally clipped and noised), ``train`` (a round's
``local_update``), ``train.personalise`` (the step after federated training),
``evaluate`` (the client scores its own model; only metrics leave).

Set ``HETFED_FLOWER_WIRE_LOG`` to a file to have every reply's record and key
names appended to it (one JSON line per reply): an audit of what left a client.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from hetfed.config import Config, build_config, parse_yaml_text
from hetfed.engine.evaluate import global_test
from hetfed.engine.executors import Pool, client_data
from hetfed.engine.rng import CLIENT_INIT, torch_gen
from hetfed.engine.types import stack_states, unstack_state
from hetfed.flower.records import (
    GAMMA,
    RUN,
    broadcast_to_records,  # noqa: F401 - re-exported for symmetry in tests
    record_to_tensors,
    records_to_broadcast,
    reports_to_records,
    state_to_record,
    summary_to_records,
    upload_to_records,
)
from hetfed.interface import Algorithm, ClientEvalData

STATE_KEY = "hetfed.state"
SUMMARY_NOISE = 23  # rng purpose: the noise on a client's Γ summary


@dataclass(frozen=True, eq=False)
class ClientSide:
    """What a node builds once per run: the config, the algorithm object and the data."""

    config: Config
    algo: Algorithm
    fed: object
    pool: Pool
    x_global: torch.Tensor
    y_global: torch.Tensor
    device: torch.device
    key: str  # the run's config and method, hashed
    features: object = None  # what Γ is measured on (the inputs, or a bag-of-words view of token ids)


_CACHE: dict[str, ClientSide] = {}


def client_side(run: ConfigRecord) -> ClientSide:
    """The run's config, algorithm and federation, built once per process (cached by config)."""
    text, method = str(run["config"]), int(run["method"])
    key = hashlib.sha256(f"{method}\n{text}".encode()).hexdigest()
    if key not in _CACHE:
        from hetfed.algorithms import algorithm_for
        from hetfed.engine.simulate import resolve_device
        from hetfed.pipeline import build_federation

        torch.set_num_threads(max(1, int(os.environ.get("HETFED_CLIENT_THREADS", "1"))))
        config = build_config(parse_yaml_text(text, "the run's config"))
        built = build_federation(config, progress=False)  # the simulator's path: holdout cut first
        fed = built.federation
        measure_on = getattr(built.clients_data, "measure_train", None)
        method_cfg = config.methods[method]
        algo = algorithm_for(config, method_cfg, fed.input_shape, fed.n_classes)
        device = resolve_device(config.method_train(method_cfg).device)
        pool = Pool(torch.as_tensor(np.asarray(fed.x, np.float32), device=device),
                    torch.as_tensor(np.asarray(fed.y, np.int64), device=device), fed.train, config.seed, fed.val)
        _CACHE.clear()  # one run at a time per process
        _CACHE[key] = ClientSide(
            config, algo, fed, pool,
            *global_test(fed, config.method_train(method_cfg), config.seed, device), device, key[:16],
            fed.x if measure_on is None else measure_on,
        )
    return _CACHE[key]


def client_id(context: Context) -> int:
    """The client this node holds: its node config's ``partition-id``."""
    if "partition-id" not in context.node_config:
        raise ValueError("this SuperNode has no partition-id in its node config: start it with "
                         "--node-config 'partition-id=K num-partitions=N'")
    return int(context.node_config["partition-id"])


def _tag(side: ClientSide) -> str:
    """Where in the node's context a method's state lives: one run may hold several methods."""
    return f"{STATE_KEY}.{side.key}"


def _state(side: ClientSide, k: int, context: Context) -> dict[str, torch.Tensor]:
    """The client's local state from the node's context (its initial state on first use)."""
    tag = _tag(side)
    if tag in context.state:
        return record_to_tensors(context.state[tag], side.device)
    return {n: v.to(side.device) for n, v in side.algo.client_init(k, torch_gen(side.config.seed, CLIENT_INIT, k)).items()}


def _keep(side: ClientSide, context: Context, new: dict[str, torch.Tensor]) -> None:
    context.state[_tag(side)] = state_to_record(new)


def _reply(message: Message, records: dict, k: int) -> Message:
    _log_wire(message.metadata.message_type, records, k)
    return Message(RecordDict(records), reply_to=message)


def _log_wire(kind: str, records: dict, k: int) -> None:
    path = os.environ.get("HETFED_FLOWER_WIRE_LOG")
    if not path:
        return
    entry = {"type": kind, "client": k, "records": {name: sorted(rec.keys()) for name, rec in records.items()}}
    with open(path, "a") as fh:
        fh.write(json.dumps(entry) + "\n")


# ------------------------------------------------------------------------- pure steps


def summary_step(side: ClientSide, k: int, request: ConfigRecord) -> dict:
    """The client's Γ summary of its own rows (train, or train ∪ val ∪ test), clipped and noised when asked:
    sent once, at set-up — see :mod:`hetfed.gamma_summaries` for what it reveals."""
    from hetfed.engine.rng import numpy_rng
    from hetfed.gamma_summaries import privatise, summarise

    rows = side.fed.measured_rows(k, str(request.get("on", "train")))
    clip = float(request["clip"]) if "clip" in request else None
    summary = summarise(np.asarray(side.features)[rows], clip)
    if "noise" in request:
        summary = privatise(summary, clip, float(request["noise"]), numpy_rng(side.config.seed, SUMMARY_NOISE, k))
    return summary_to_records(summary)


def train_step(side: ClientSide, k: int, state: dict, content: RecordDict) -> tuple[dict, dict]:
    """A round's ``local_update`` for client ``k`` → (reply records, new state)."""
    bc = records_to_broadcast(content, side.device)
    upload, new = side.algo.local_update(bc, stack_states([state]) if state else {}, client_data(side.pool, [k], bc.round))
    new_state = unstack_state(new, 1)[0] if new else {}
    return upload_to_records(upload), new_state


def personalise_step(side: ClientSide, k: int, state: dict, content: RecordDict) -> tuple[dict, dict]:
    bc = records_to_broadcast(content, side.device)
    new, info = side.algo.personalise(bc, stack_states([state]) if state else {}, client_data(side.pool, [k], bc.round, True))
    new_state = unstack_state(new, 1)[0] if new else {}
    return {"info": MetricRecord({key: float(v[0]) for key, v in info.items()})}, new_state


def evaluate_step(side: ClientSide, k: int, state: dict, content: RecordDict) -> dict:
    bc = records_to_broadcast(content, side.device)
    view = content["bc"].get("view") or None
    fed = side.fed
    scorers = content["bc"].get("scorers")  # None: every evaluated client scores the global test set
    data = ClientEvalData([k], side.pool.x, side.pool.y, [fed.test[k]], [fed.val[k]], side.x_global, side.y_global,
                          fed.n_classes, None if scorers is None else [k in set(scorers)], [fed.train[k]])
    reports = side.algo.evaluate_client(bc, stack_states([state]) if state else {}, data, view)
    return reports_to_records(reports)


# ---------------------------------------------------------------------------- the app

app = ClientApp()


@app.query()
def query(message: Message, context: Context) -> Message:
    """Which client this node holds (the server maps client ids to nodes once per run).

    The node also builds its client's data now, during set-up, rather than in the first round.
    """
    k = client_id(context)
    records: dict = {"node": MetricRecord({"client": k})}
    if RUN in message.content:
        side = client_side(message.content[RUN])
        if GAMMA in message.content:
            records.update(summary_step(side, k, message.content[GAMMA]))
    return _reply(message, records, k)


@app.train()
def train(message: Message, context: Context) -> Message:
    side, k = client_side(message.content[RUN]), client_id(context)
    records, new = train_step(side, k, _state(side, k, context), message.content)
    _keep(side, context, new)
    return _reply(message, records, k)


@app.train("personalise")
def personalise(message: Message, context: Context) -> Message:
    side, k = client_side(message.content[RUN]), client_id(context)
    records, new = personalise_step(side, k, _state(side, k, context), message.content)
    _keep(side, context, new)
    return _reply(message, records, k)


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    side, k = client_side(message.content[RUN]), client_id(context)
    return _reply(message, evaluate_step(side, k, _state(side, k, context), message.content), k)
