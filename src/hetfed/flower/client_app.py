"""The hetfed ``ClientApp``: a SuperNode's clients — one, or a cohort — run the same algorithm object as in-process.

Each SuperNode builds its clients' data from the run's config (sent in every
message; the node config's ``partition-id`` / ``num-partitions`` say which of the
federation's clients it holds, :func:`hetfed.flower.node.node_clients`), so a
Flower run trains on exactly the federation the simulator builds, and trains them
with the in-process vectorised executor (:mod:`hetfed.flower.node`). The clients'
local state — CGAU conditioning rows, kept optimiser state, FedMoE specialists
and gates — lives in the node's ``context.state`` across rounds and never
appears in a reply: replies carry only what :mod:`hetfed.flower.records` puts
there (shared parameters or, for a cohort, their weighted sum; sample counts;
documented extras; metrics).

Message types: ``query`` (which clients does this node hold? — and, once per run,
their Γ summaries: count, Σx, Σxxᵀ of each client's own rows, optionally clipped
and noised; the question usually rides on the run's first step instead, ``SETUP``:
:func:`with_set_up`), ``train`` (a round's ``local_update`` for the node's sampled clients),
``train.personalise`` (the step after federated training), ``evaluate`` (each
client scores its own model; only metrics leave). Every message but the query
names the node's clients it is for (:data:`hetfed.flower.node.CLIENTS`). A ``train``
message may also carry the last round's evaluation (``EVALUATE_FIRST``: score the
model, then train on it — one exchange per round), or be one of a SecAgg+ round's
four (:mod:`hetfed.flower.secure`: Flower's ``secaggplus_mod`` masks the update).

Messages usually travel packed (one Flower array: :mod:`hetfed.flower.packing`); every handler reads and writes
the records themselves, and a node answers in the form it was asked (:func:`as_asked`).

Set ``HETFED_FLOWER_WIRE_LOG`` to a file to have every reply's record and key
names appended to it (one JSON line per reply, or per step of a reply that carries two): an audit of what left
a node.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS as SECAGG

from hetfed.flower.audit import log_timing, log_wire, secure_aggregation
from hetfed.flower.node import (
    NodeSide,
    keep_states,
    load_states,
    node_clients,
    node_side,
    reduces,
    step_clients,
)
from hetfed.flower.packing import is_packed, pack, unpack
from hetfed.flower.records import (
    CLIENTS,
    EVALUATE_FIRST,
    GAMMA,
    RUN,
    SETUP,
    VIEW_RECORDS,
    VIEWS_AFTER,
    listed,
    number,
    records_to_broadcast,
    reports_to_records,
    summary_to_records,
    upload_to_records,
)

#: set by the node's worker (:mod:`hetfed.flower.worker`) while it runs a step for a ClientApp process: that
#: process's start and imports (its timing line reports them, not the worker's)
CALLER: dict | None = None


def _reply(message: Message, records: dict, clients: list[int]) -> Message:
    log_wire(message.metadata.message_type, records, clients)
    return Message(RecordDict(records), reply_to=message)


# ------------------------------------------------------------------------- pure steps


def summary_step(side: NodeSide, clients: list[int], request: ConfigRecord) -> dict:
    """Each client's Γ summary of its own rows (train, or train ∪ val ∪ test), clipped and noised when asked:
    sent once, at set-up — see :mod:`hetfed.gamma_summaries` for what it reveals.

    The noise comes from the node's operating-system entropy, never from the run's seed: the server chose
    that seed (it is in the config it sends), so noise drawn from it is noise the server can redraw and
    subtract, and the reported (ε, δ) would protect nothing against the party it is meant for.
    """
    from hetfed.gamma_summaries import privatise, summarise

    clip = number(request["clip"]) if "clip" in request else None
    secret = np.random.default_rng()  # fresh OS entropy: unknown to the server, different on every node
    out = []
    for k in clients:
        summary = summarise(np.asarray(side.features)[side.fed.measured_rows(k, str(request.get("on", "train")))], clip)
        if "noise" in request:
            if clip is None:  # the config refuses summary_noise without summary_clip; a request must agree
                raise ValueError("a noised Γ summary needs a clip (flower.summary_clip)")
            summary = privatise(summary, clip, number(request["noise"]), secret)
        out.append(summary)
    return summary_to_records(out)


def secure_train_step(side: NodeSide, clients: list[int], content: RecordDict, context: Context) -> dict:
    """The training step of a SecAgg+ round (``flower.secure_aggregation``): the cohort's update reduced on the
    node, in the form Flower's ``secaggplus_mod`` masks (:func:`hetfed.flower.secure.node_reply`)."""
    from hetfed.flower.secure import node_max_weight, node_reply

    bc = records_to_broadcast(content, side.executor.device, clients)
    return node_reply(side.executor.train(bc, clients, reduce=True), bc.params, node_max_weight(context))


def train_step(side: NodeSide, clients: list[int], content: RecordDict) -> dict:
    """A round's ``local_update`` for the node's ``clients`` → the reply's records (states stay in the executor;
    the upload names the clients as the federation numbers them: :meth:`VectorisedExecutor.number_from`)."""
    bc = records_to_broadcast(content, side.executor.device, clients)
    return upload_to_records(side.executor.train(bc, clients, reduce=reduces(side, clients)))


def personalise_step(side: NodeSide, clients: list[int], content: RecordDict) -> dict:
    """The clients' personalisation; then, when the message asks (``VIEWS_AFTER``), each view scored by the
    clients it names, from the same model — the views' evaluations in the same exchange (each view's records
    named ``VIEW_RECORDS``)."""
    bc = records_to_broadcast(content, side.executor.device, clients)
    info = side.executor.personalise(bc, clients)
    records = {"info": MetricRecord({key: [float(v) for v in values] for key, values in info.items()})}
    if VIEWS_AFTER in content.config_records:
        asked = content.config_records[VIEWS_AFTER]
        scored = [clients[int(j)] for j in listed(asked["at"])]
        for view in listed(asked["views"]):
            reports = reports_to_records(side.executor.evaluate(bc, scored, str(view)))
            records.update({VIEW_RECORDS.format(view=view, name=name): r for name, r in reports.items()})
    return records


def evaluate_step(side: NodeSide, clients: list[int], among: list[int] | None, content: RecordDict) -> dict:
    bc = records_to_broadcast(content, side.executor.device, clients)
    view = str(content.config_records["bc"].get("view") or "") or None
    return reports_to_records(side.executor.evaluate(bc, clients, view, among=among))


# ---------------------------------------------------------------------------- the app

app = ClientApp()


def as_asked(handler: Callable[[Message, Context], Message]) -> Callable[[Message, Context], Message]:
    """``handler`` on the message's records, unpacked when they came packed (:mod:`hetfed.flower.packing`), and its
    reply packed then: a node answers in the form it was asked."""

    @functools.wraps(handler)
    def handled(message: Message, context: Context) -> Message:
        packed = message.has_content() and is_packed(message.content)
        if packed:
            message.content = unpack(message.content)
        reply = handler(message, context)
        if packed and reply.has_content():
            reply.content = pack(reply.content)
        return reply

    return handled


def set_up(content: RecordDict, node_config) -> tuple[dict, list[int]]:
    """The set-up question's answer — which clients this node holds (and, when asked, their Γ summaries) — and
    those clients. The node also builds its clients' data now (the question comes first, or with the first step)."""
    from hetfed.errors import HetfedError
    from hetfed.flower.node_data import check_node_config, own_data, position

    own = own_data(node_config)
    try:
        check_node_config(node_config)
        side = node_side(content.config_records[RUN], node_config)
        place = position(node_config) if own else None
    except HetfedError as err:  # the node's own file does not fit the run: the server's user reads why
        return {"node": ConfigRecord({"error": str(err), "own": own})}, []
    clients = node_clients(node_config, side.fed.n_clients)
    records: dict = {"node": ConfigRecord({"clients": clients, "own": own,
                                           **({"position": place} if place is not None else {})})}
    if GAMMA in content and clients:
        records.update(summary_step(side, clients, content.config_records[GAMMA]))
    return records, clients


@app.query()
@as_asked
def query(message: Message, context: Context) -> Message:
    """Which clients this node holds (the server maps client ids to nodes once per run)."""
    records, clients = set_up(message.content, context.node_config)
    return _reply(message, records, clients)


def with_set_up(handler: Callable[[Message, Context], Message]) -> Callable[[Message, Context], Message]:
    """``handler``, and the set-up question when it rides on the message (:data:`SETUP`: the run's first step,
    naming the step's clients wherever they are held): the answer, then the step for the named clients this node
    holds (none: the answer alone), in one reply."""

    @functools.wraps(handler)
    def handled(message: Message, context: Context) -> Message:
        content = message.content
        if SETUP not in content.config_records:
            return handler(message, context)
        records, held = set_up(content, context.node_config)
        log_wire("query", records, held)
        asked = content.config_records[CLIENTS]
        holds = set(held)
        mine = [int(k) for k in listed(asked["ids"]) if int(k) in holds]
        if not mine:
            return Message(RecordDict(records), reply_to=message)
        content[CLIENTS] = ConfigRecord({**dict(asked), "ids": mine})
        reply = handler(message, context)
        if reply.has_content():
            reply.content = RecordDict({**records, **dict(reply.content)})  # the names never collide
        return reply

    return handled


def _step(message: Message, context: Context, run, changes_state: bool = True, logged: bool = True) -> Message:
    """Load the step's clients' states from the node's context, run the step, keep their new states (a step
    that only reads them, evaluation, writes nothing back). ``logged``: False when a mod changes the reply before
    it leaves (and logs what does)."""
    handler = time.time()
    side = node_side(message.content.config_records[RUN], context.node_config)
    clients, among, offset = step_clients(message.content)
    side.executor.number_from(offset)  # a node with its own data: its clients' seeds and ids are the federation's
    load_states(side, clients, context)
    ready = time.time()
    records = run(side, clients, among)
    if changes_state:
        keep_states(side, clients, context)
    log_timing(message.metadata.message_type, handler, ready, time.time(), CALLER)
    if not logged:
        return Message(RecordDict(records), reply_to=message)
    return _reply(message, records, [k + offset for k in clients])


@app.train(mods=[secure_aggregation])
@as_asked
@with_set_up
def train(message: Message, context: Context) -> Message:
    if SECAGG in message.content.config_records:  # the training step of a SecAgg+ round: the mod masks the reply
        return _step(message, context, lambda side, clients, _: secure_train_step(side, clients, message.content,
                                                                                  context), logged=False)
    if EVALUATE_FIRST in message.content.config_records:  # the last round's evaluation rides on this training
        return evaluate_then_train(message, context)
    return _step(message, context, lambda side, clients, _: train_step(side, clients, message.content))


def evaluate_then_train(message: Message, context: Context) -> Message:
    """One exchange for two steps: the node's ``EVALUATE_FIRST`` clients score the model the message brings (the
    last round's evaluation), then its training clients train from it (this round's training); the reply carries
    both — the evaluation's records and the upload's, whose names never collide. Logged as the two steps."""
    handler = time.time()
    content = message.content
    side = node_side(content.config_records[RUN], context.node_config)
    trained, _, offset = step_clients(content)
    asked = content.config_records[EVALUATE_FIRST]
    scored = [int(k) - offset for k in listed(asked["ids"])]
    among = [int(k) for k in listed(asked["among"])] if "among" in asked else None
    side.executor.number_from(offset)
    held = trained + [k for k in scored if k not in trained]  # the order the server sent their personal rows in
    bc = records_to_broadcast(content, side.executor.device, held)
    load_states(side, held, context)
    ready = time.time()
    records: dict = {}
    if scored:
        records.update(reports_to_records(side.executor.evaluate(bc, scored, None, among=among)))
        log_wire("evaluate", records, [k + offset for k in scored])
    if trained:
        upload = upload_to_records(side.executor.train(bc, trained, reduce=reduces(side, trained)))
        keep_states(side, trained, context)
        log_wire("train", upload, [k + offset for k in trained])
        records.update(upload)
    log_timing("train", handler, ready, time.time(), CALLER)
    return Message(RecordDict(records), reply_to=message)


@app.train("personalise")
@as_asked
@with_set_up
def personalise(message: Message, context: Context) -> Message:
    return _step(message, context, lambda side, clients, _: personalise_step(side, clients, message.content))


@app.evaluate()
@as_asked
@with_set_up
def evaluate(message: Message, context: Context) -> Message:
    return _step(message, context, lambda side, clients, among: evaluate_step(side, clients, among, message.content),
                 changes_state=False)
