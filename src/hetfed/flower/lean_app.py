"""The ClientApp a deployment runs: Flower's process per message, hetfed's steps in the node's persistent worker.

A SuperNode starts a fresh ``flwr-clientapp`` process for every message. This app imports Flower and a few light
modules only — no torch, no hetfed registries — and hands each message to the node's worker
(:mod:`hetfed.flower.worker`), which runs :mod:`hetfed.flower.client_app`'s handler on it: the same step, the same
reply, the same records written into ``context.state`` (a test compares the two apps on one deployment). What is
left per message is Flower's own floor: the process, Flower's imports, the exchange.

SecAgg+'s mod runs here, where Flower's own runtime calls it: it keeps its secrets in this node's context, masks
the reply the worker computed, and the wire log gets what leaves. ``HETFED_FLOWER_WORKER=0`` runs the steps in this
process instead (importing hetfed's ClientApp: torch and all).
"""

from __future__ import annotations

import os
import time

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from hetfed.environment import refuse_unknown
from hetfed.flower import worker
from hetfed.flower.audit import caller, secure_aggregation

app = ClientApp()


def _handled(name: str, message: Message, context: Context) -> Message:
    """``name``'s step of :mod:`hetfed.flower.client_app` on the message: in the node's worker, or here — once the
    node's ``HETFED_*`` variables are all ones hetfed reads (a mistyped one fails the step, naming it)."""
    refuse_unknown()
    if not worker.enabled():
        from hetfed.flower import client_app

        return getattr(client_app, name)(message, context)
    # this process's clock for the timing log, read only when one is kept
    timing = {**caller(), "forwarded": time.time()} if os.environ.get("HETFED_FLOWER_TIMING") else None
    content = worker.forward(name, message, context, timing)
    return Message(content, reply_to=message)


@app.query()
def query(message: Message, context: Context) -> Message:
    return _handled("query", message, context)


@app.train(mods=[secure_aggregation])
def train(message: Message, context: Context) -> Message:
    return _handled("train", message, context)


@app.train("personalise")
def personalise(message: Message, context: Context) -> Message:
    return _handled("personalise", message, context)


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    return _handled("evaluate", message, context)
