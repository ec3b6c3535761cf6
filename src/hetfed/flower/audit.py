"""A node's audit logs — what left it (``HETFED_FLOWER_WIRE_LOG``) and where each message's time went
(``HETFED_FLOWER_TIMING``) — and the SecAgg+ mod, which must log what really leaves after it masked the reply.

Light on purpose (Flower and the standard library): the deployments' ClientApp process
(:mod:`hetfed.flower.lean_app`) uses it without importing torch.
"""

from __future__ import annotations

import json
import os
import time

from flwr.app import Context, Message
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS as SECAGG

from hetfed.flower.names import CLIENTS, listed

#: when this process had imported hetfed's ClientApp (a deployment starts one process per message)
IMPORTED = time.time()


def process_start() -> float | None:
    """When this process started (Linux: /proc), or None."""
    try:
        with open("/proc/self/stat") as fh:
            ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as fh:
            boot = next(float(line.split()[1]) for line in fh if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def caller() -> dict:
    """This ClientApp process's start and the end of its imports (what a worker's timing line reports)."""
    return {"process_start": process_start(), "imported": IMPORTED}


def log_timing(kind: str, handler: float, ready: float, computed: float, came_from: dict | None = None) -> None:
    """With ``HETFED_FLOWER_TIMING`` set to a file: where this message's time went (the ClientApp process's start,
    the end of its imports — ``came_from``'s when a worker ran the step for it, with the time that process handed
    the message over (``forwarded``) —, hetfed's handler entered, the node's data and states ready, the step
    computed, the reply built; wall-clock seconds) — one JSON line per message (``benchmarks/engines.py`` reads
    it)."""
    if os.environ.get("HETFED_FLOWER_TIMING"):
        start = came_from or caller()
        append("HETFED_FLOWER_TIMING", {"type": kind, "pid": os.getpid(), "process_start": start["process_start"],
                                        "imported": start["imported"], "handler": handler, "ready": ready,
                                        "computed": computed, "replied": time.time(),
                                        **({"forwarded": came_from["forwarded"]} if came_from else {})})


def append(variable: str, entry: dict) -> None:
    """One JSON line appended to the file the environment ``variable`` names (the node's audit logs), if set."""
    path = os.environ.get(variable)
    if path:
        with open(path, "a") as fh:
            fh.write(json.dumps(entry) + "\n")


def log_wire(kind: str, records: dict, clients: list[int]) -> None:
    append("HETFED_FLOWER_WIRE_LOG", {"type": kind, "clients": clients,
                                      "records": {name: sorted(rec.keys()) for name, rec in records.items()}})


def secure_aggregation(message: Message, context: Context, call_next) -> Message:
    """Flower's ``secaggplus_mod`` for the messages of a SecAgg+ round (they carry its config record; the server
    sends them only with ``flower.secure_aggregation``); every other message passes untouched. The wire log gets
    what really leaves: the masked vector, never the update."""
    if SECAGG not in message.content.config_records:
        return call_next(message, context)
    from flwr.client.mod import secaggplus_mod

    reply = secaggplus_mod(message, context, call_next)
    held = (
        [int(k) for k in listed(message.content.config_records[CLIENTS]["ids"])] if CLIENTS in message.content else []
    )
    log_wire(f"{message.metadata.message_type}.secaggplus", dict(reply.content.items()), held)
    return reply
