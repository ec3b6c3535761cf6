"""Set-up of a federation whose SuperNodes hold their own data (``dataset.name: nodes``).

The server has no dataset to build a federation from: it waits for ``flower.nodes``
SuperNodes, asks each which clients it holds (each node reads and checks its own
file against the run's schema) and for their Γ summaries, and builds what the
server may know — a :class:`~hetfed.partition.NodesFederation`: the number of
clients and which node holds which, no data, no sizes — plus Γ computed from the
summaries alone. A node whose file does not fit is named with its problem; the
run goes on without it while at least ``flower.min_replies`` clients remain.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
from flwr.app import Message

from hetfed.config import Config, dump_config
from hetfed.errors import RunError
from hetfed.flower.exchange import send_and_receive
from hetfed.flower.executor import query_content
from hetfed.flower.node_data import server_test
from hetfed.flower.packing import pack, unpack_replies
from hetfed.flower.records import listed, records_to_summaries
from hetfed.heterogeneity import Heterogeneity
from hetfed.partition import NodesFederation
from hetfed.pipeline import Prepared


def discover(grid, config: Config, warn=print) -> Prepared:
    """The federation of the nodes that answer (see the module docstring); ``warn`` gets one line per refused node."""
    f = config.flower
    t0 = time.monotonic()
    deadline = t0 + f.connect_timeout
    node_ids: list[int] = []
    while time.monotonic() < deadline:
        node_ids = sorted(grid.get_node_ids())
        if len(node_ids) >= (f.nodes or 1):
            break
        time.sleep(0.2)
    if not node_ids:
        raise RunError(f"Flower: no SuperNode connected within flower.connect_timeout = {f.connect_timeout:g} s; "
                       f"expected flower.nodes = {f.nodes} nodes started with --node-config 'data=\"FILE\" ...'")
    hello = query_content(config, dump_config(config), 0, summaries=config.heterogeneity.gamma)
    messages = [Message(pack(hello) if f.packed_messages else hello, dst_node_id=n, message_type="query")
                for n in node_ids]
    replies = {m.metadata.src_node_id: m for m in send_and_receive(grid, messages,
                                                                   max(1.0, deadline - time.monotonic()))}
    unpack_replies(replies.values())
    usable, problems = _usable(node_ids, replies)
    nodes: list[tuple[int, int, int]] = []
    summaries: list[Any] = []
    for node, held, node_summaries, _ in usable:  # their clients numbered in this order (the offsets)
        nodes.append((node, sum(m for _, _, m in nodes), held))
        summaries += node_summaries
    for line in problems:
        warn(f"warning: {line}; the run goes on without this node")
    for line in _shared_positions([(node, place) for node, _, _, place in usable]):
        warn(line)
    n_clients = sum(m for _, _, m in nodes)
    if n_clients < max(1, f.min_replies):
        raise RunError(f"Flower: {len(nodes)} of flower.nodes = {f.nodes} SuperNodes serve usable data "
                       f"({n_clients} clients, flower.min_replies = {f.min_replies})"
                       + (f": {'; '.join(problems)}" if problems else ""))
    if len(node_ids) < (f.nodes or 1):
        warn(f"warning: {len(node_ids)} of flower.nodes = {f.nodes} SuperNodes connected within "
             f"flower.connect_timeout = {f.connect_timeout:g} s; the run goes on with them")
    fed = skeleton(config, nodes)
    # no data here: the nodes hold it
    return Prepared(None, fed, gamma_of(config, summaries), (), [])


def _usable(node_ids: list[int], replies: dict[int, Any]
            ) -> tuple[list[tuple[int, int, list[Any], int | None]], list[str]]:
    """The nodes that serve usable data — each one's id, how many clients it holds, their Γ summaries and its
    position — in the
    order their clients are numbered: by the ``position`` a node's config gives (:data:`~hetfed.flower.node_data.
    POSITION`; the same numbers whenever the deployment is started again, and a node's clients the numbers its
    position gives), the others after them, each group by node id; and a line for each node refused."""
    usable: list[tuple[int, int, list[Any], int | None]] = []
    problems: list[str] = []
    for node in node_ids:
        reply = replies.get(node)
        if reply is None or reply.has_error():
            reason = "no answer" if reply is None else str(reply.error.reason).strip().splitlines()[-1][:300]
            problems.append(f"SuperNode {node}: {reason}")
            continue
        rec = reply.content.config_records["node"]
        if "error" in rec:
            problems.append(f"SuperNode {node}: {rec['error']!s}")
            continue
        if not bool(rec.get("own", False)):
            problems.append(f"SuperNode {node}: serves a simulated partition (partition-id), not its own data; "
                            "expected --node-config 'data=\"FILE\" label=\"COLUMN\"'")
            continue
        place = rec.get("position")
        usable.append((node, len(listed(rec["clients"])), records_to_summaries(reply.content),
                       None if place is None else int(place)))
    return sorted(usable, key=lambda u: (u[3] is None, u[3] or 0, u[0])), problems


def _shared_positions(places: list[tuple[int, int | None]]) -> list[str]:
    """A line for each position that several of the (node, position) ``places`` give: their clients are numbered in
    the order of the nodes' ids, which Flower draws anew at every start — what positions are there to prevent."""
    holders: dict[int, list[int]] = {}
    for node, place in places:
        if place is not None:
            holders.setdefault(place, []).append(node)
    return [f"warning: SuperNodes {', '.join(map(str, held))} all have position={place}: their clients are numbered "
            "in the order of the nodes' ids, which changes at every start; expected a position of its own a node"
            for place, held in sorted(holders.items()) if len(held) > 1]


def skeleton(config: Config, nodes: list[tuple[int, int, int]]) -> NodesFederation:
    """What the server knows of the nodes' federation: clients and where they are, no rows of theirs — and the
    server's own test set, where it holds one (``dataset.global_test``)."""
    n = sum(m for _, _, m in nodes)
    d, shape = int(config.dataset.params.features or 0), config.dataset.params.input_shape()
    empty = tuple(np.zeros(0, np.int64) for _ in range(n))
    x_global, y_global = server_test(config.dataset.params)
    return NodesFederation(
        x=np.zeros((0, d), np.float32), y=np.zeros(0, np.int64), train=empty, val=empty, test=empty,
        x_global_test=x_global, y_global_test=y_global,
        n_classes=len(config.dataset.params.classes or []), opted_out=np.zeros(n, dtype=bool), input_shape=shape,
        kind="nodes", params={"nodes": len(nodes)}, nodes=tuple(nodes))


def gamma_of(config: Config, summaries: list) -> Heterogeneity:
    """Γ (and its size-matched reference) of the nodes' clients from their summaries; label skew is not
    measured (the labels never leave the nodes); nothing with ``heterogeneity.gamma: false`` (none was asked)."""
    from hetfed.gamma_summaries import gamma_from_summaries, gamma_iid_from_summaries, released

    h, nan = config.heterogeneity, float("nan")
    unseen: dict[str, Any] = {"label_emd": [], "label_emd_mean": nan, "js_mean": nan, "class_counts": [],
                              "measured_on": h.on}  # the labels never leave the nodes
    if not h.gamma:
        return Heterogeneity(gamma=nan, gamma_measured=False, **unseen)
    if config.flower.summary_noise:  # noised: made valid first (counts ≥ 2, PSD covariances), as every Γ of them
        summaries = [released(s) for s in summaries]
    g = gamma_from_summaries(summaries) if len(summaries) >= 1 else nan
    iid, sd = gamma_iid_from_summaries(summaries, h.iid_draws, h.iid_max_clients, config.seed)
    return Heterogeneity(gamma=g, gamma_iid=iid, gamma_iid_sd=sd, **unseen)
