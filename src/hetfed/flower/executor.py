"""The server side on Flower: an executor that sends the client steps as messages.

:class:`FlowerExecutor` implements the same :class:`~hetfed.engine.executors.Executor`
protocol as the in-process executors, so :func:`hetfed.engine.simulate.simulate`
drives a Flower federation with the same round loop: sample → broadcast →
``train`` messages to the sampled clients' nodes → aggregate their uploads →
``evaluate`` messages. Clients are never sent anything they would not get
in-process: opted-out clients never receive a ``train`` message.

A round proceeds with the replies it has: a node that fails (an error reply, or
no reply within ``flower.round_timeout``) is recorded in :attr:`failures`, and the
round is aggregated over the others if at least ``flower.min_replies`` replied
(else it is skipped: the global model stays as it was).
"""

from __future__ import annotations

import time

import torch
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from hetfed.config import FlowerConfig, dump_config
from hetfed.engine.executors import RoundSkipped
from hetfed.engine.robust import Screen
from hetfed.engine.sampling import global_scorers
from hetfed.engine.types import Broadcast, RoundUploads, Upload
from hetfed.errors import RunError
from hetfed.flower.records import (
    GAMMA,
    RUN,
    broadcast_to_records,
    records_to_reports,
    records_to_summary,
    records_to_upload,
)
from hetfed.interface import Algorithm


class FlowerExecutor:
    """Client steps as Flower messages through a ``Grid`` (Simulation Engine or a SuperLink)."""

    name = "flower"

    def __init__(self, grid: Grid, config, method: int, flower: FlowerConfig | None = None):
        self.grid = grid
        self.config_text = dump_config(config)
        self.method = method
        self.flower = flower or config.flower
        self.nodes: dict[int, int] = {}  # client id → node id
        self.failures: list[dict] = []  # {"step", "round", "clients", "errors"}
        self.errors: dict[int, str] = {}  # node → the error its ClientApp raised (this step)
        self.messages = 0
        self.measured_on = config.heterogeneity.on
        #: Γ from the summaries the clients sent at set-up (flower.gamma_summaries), with its (ε, δ) when noised
        self.gamma_summaries: dict | None = None

    # -- set-up: which node holds which client
    def start(self, algo: Algorithm, fed, seed: int, device: torch.device) -> None:
        self.algo, self.fed, self.seed = algo, fed, seed
        deadline = time.monotonic() + self.flower.connect_timeout
        node_ids: list[int] = []
        while time.monotonic() < deadline:
            node_ids = list(self.grid.get_node_ids())
            if len(node_ids) >= fed.n_clients:
                break
            time.sleep(0.2)
        if len(node_ids) < fed.n_clients:
            raise RunError(
                f"Flower: {len(node_ids)} SuperNodes connected within flower.connect_timeout = "
                f"{self.flower.connect_timeout:g} s, but the federation has {fed.n_clients} clients: expected one "
                "SuperNode per client (--node-config 'partition-id=K num-partitions=N')"
            )
        hello = RecordDict({RUN: ConfigRecord({"config": self.config_text, "method": self.method}),
                            **({GAMMA: self._summary_request()} if self.flower.gamma_summaries else {})})
        t0 = time.monotonic()
        replies = self._send([(n, hello, "query") for n in node_ids], timeout=self.flower.connect_timeout)
        summaries = {}
        for node, reply in replies.items():
            if reply is not None:
                k = int(reply.content["node"]["client"])
                self.nodes[k] = node
                if "summary" in reply.content:
                    summaries[k] = records_to_summary(reply.content)
        missing = sorted(set(range(fed.n_clients)) - set(self.nodes))
        if missing:
            raise RunError(missing_nodes_message(missing, len(node_ids), fed.n_clients, self.flower.connect_timeout,
                                                 time.monotonic() - t0))
        if self.flower.gamma_summaries and len(summaries) == fed.n_clients:
            self.gamma_summaries = self._gamma(summaries)

    def _summary_request(self) -> ConfigRecord:
        f = self.flower
        request = {"on": self.measured_on}
        if f.summary_clip is not None:
            request["clip"] = float(f.summary_clip)
        if f.summary_noise is not None:
            request["noise"] = float(f.summary_noise)
        return ConfigRecord(request)

    def _gamma(self, summaries: dict) -> dict:
        """Γ of the federation from its clients' summaries alone (and the summaries' (ε, δ) when noised)."""
        from hetfed.gamma_summaries import gamma_from_summaries, summary_epsilon

        f = self.flower
        out = {"gamma": gamma_from_summaries([summaries[k] for k in sorted(summaries)]), "clients": len(summaries),
               "measured_on": self.measured_on, "clip": f.summary_clip, "noise_multiplier": f.summary_noise}
        if f.summary_noise is not None:
            out.update(epsilon=summary_epsilon(f.summary_noise, f.summary_delta) if f.summary_noise > 0 else None,
                       delta=f.summary_delta)
        return out

    # -- messaging
    def _content(self, bc: Broadcast, **extra_config) -> RecordDict:
        records = broadcast_to_records(bc)
        if extra_config:
            records["bc"] = ConfigRecord({**dict(records["bc"]), **extra_config})  # view, scorers
        records[RUN] = ConfigRecord({"config": self.config_text, "method": self.method})
        return RecordDict(records)

    def _send(self, targets: list[tuple[int, RecordDict, str]], timeout: float | None, group: str = "") -> dict[int, Message | None]:
        """node → its reply (None when it failed or did not answer in time)."""
        messages = [Message(content, dst_node_id=node, message_type=kind, group_id=group) for node, content, kind in targets]
        self.messages += len(messages)
        replies = {m.metadata.src_node_id: m for m in send_and_receive(self.grid, messages, timeout)}
        self.errors = {node: str(r.error.reason or f"error code {r.error.code}")
                       for node, r in replies.items() if r is not None and r.has_error()}
        return {node: (r if r is not None and not r.has_error() else None)
                for node, r in ((node, replies.get(node)) for node, _, _ in targets)}

    def _ask(self, step: str, bc: Broadcast, clients: list[int], kind: str, **extra) -> dict[int, RecordDict]:
        content = self._content(bc, **extra)
        replies = self._send([(self.nodes[k], content, kind) for k in clients], self.flower.round_timeout, str(bc.round))
        by_node = {node: k for k, node in self.nodes.items()}
        answered = {by_node[node]: r.content for node, r in replies.items() if r is not None}
        failed = sorted(set(clients) - set(answered))
        if failed:
            errors = {by_node[n]: reason for n, reason in self.errors.items() if n in by_node}
            self.failures.append({"step": step, "round": bc.round, "clients": failed, "errors": errors})
            if errors and len(errors) == len(clients):  # not slow or dead nodes: the ClientApp itself fails
                k, reason = next(iter(sorted(errors.items())))
                raise RunError(f"Flower: every ClientApp failed in step {step!r}, round {bc.round} (client {k}: "
                               f"{_last_line(reason)}); nothing was trained, so the run stops")
            if errors:
                from hetfed.console import make_console

                k, reason = next(iter(sorted(errors.items())))
                make_console(stderr=True).print(
                    f"warning: {len(errors)} ClientApp(s) failed in step {step!r}, round {bc.round} (client {k}: "
                    f"{_last_line(reason)}); counted as failed clients", style="yellow", soft_wrap=True)
        return answered

    # -- the executor protocol
    def train(self, bc: Broadcast, clients: list[int]) -> Upload:
        answered = self._ask("train", bc, clients, "train")
        if len(answered) < min(self.flower.min_replies, len(clients)):
            raise RoundSkipped(bc.round, len(answered), self.flower.min_replies)
        uploads = RoundUploads(Screen.for_round(self.algo, bc.params), stream=False)
        for k in sorted(answered):
            uploads.add(records_to_upload(answered[k]))
        return uploads.result()

    def personalise(self, bc: Broadcast, clients: list[int], on_chunk=None) -> dict[str, list[float]]:
        answered = self._ask("personalise", bc, clients, "train.personalise")
        info: dict[str, list[float]] = {}
        for k in clients:
            if k in answered:
                for key, value in answered[k]["info"].items():
                    info.setdefault(key, []).append(float(value))
        if on_chunk:
            on_chunk(len(clients), len(clients))
        return info

    def evaluate(self, bc: Broadcast, clients: list[int], view: str | None = None) -> dict[str, list]:
        scorers = None if view else global_scorers(self.algo.train, clients, self.seed)
        extra = {**({"view": view} if view else {}),
                 **({"scorers": [k for k, s in zip(clients, scorers, strict=True) if s]} if scorers else {})}
        answered = self._ask("evaluate", bc, clients, "evaluate", **extra)
        reports: dict[str, list] = {"client_ids": [k for k in clients if k in answered]}
        for k in reports["client_ids"]:
            for key, values in records_to_reports(answered[k]).items():
                reports.setdefault(key, []).extend(values)
        return reports

    def stop(self) -> None:
        return None


#: first and longest wait between two polls for replies (seconds); the wait doubles while nothing comes
POLL_FIRST, POLL_LONGEST = 0.01, 0.5


def send_and_receive(grid, messages: list[Message], timeout: float | None) -> list[Message]:
    """Push ``messages`` and pull their replies until all came or ``timeout`` passed — Flower's own
    ``Grid.send_and_receive``, but polling from 10 ms and backing off to 0.5 s: a deployment's grid
    (``GrpcGrid``) sleeps 3 s between polls, which made every round of a loopback deployment cost
    several seconds of waiting however fast the clients answered. Only Flower's public
    ``push_messages`` / ``pull_messages`` are used."""
    pending = set(grid.push_messages(messages))
    end = None if timeout is None else time.monotonic() + timeout
    replies: list[Message] = []
    wait = POLL_FIRST
    while pending:
        got = list(grid.pull_messages(pending))
        replies.extend(got)
        pending.difference_update(m.metadata.reply_to_message_id for m in got)
        if not pending or (end is not None and time.monotonic() >= end):
            break
        time.sleep(wait if end is None else max(0.0, min(wait, end - time.monotonic())))
        wait = POLL_FIRST if got else min(2 * wait, POLL_LONGEST)
    return replies


def missing_nodes_message(missing: list[int], connected: int, n_clients: int, timeout: float, waited: float) -> str:
    """Why set-up failed, in one line: the timeout and its value when it passed, how many nodes answered."""
    answered = n_clients - len(missing)
    shown = ", ".join(map(str, missing[:10])) + (" …" if len(missing) > 10 else "")
    if waited >= timeout * 0.99:
        return (f"Flower: flower.connect_timeout = {timeout:g} s passed with {answered} of {n_clients} clients' "
                f"SuperNodes answering ({connected} connected; no answer for clients {shown}): raise "
                "flower.connect_timeout (a loaded machine starts Ray's workers slowly) or check those SuperNodes")
    return (f"Flower: {answered} of {n_clients} clients' SuperNodes answered ({connected} connected); none holds "
            f"clients {shown}: expected one SuperNode per client with partition-id 0..{n_clients - 1}")


def _last_line(reason: str) -> str:
    """The exception line of a ClientApp's error reply (its reason holds Ray's and Python's tracebacks)."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", reason.replace("\\n", "\n"))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    raised = [ln for ln in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*:", ln)
              and not ln.startswith(("ray.", "flwr."))]
    return (raised[-1] if raised else lines[-1] if lines else reason)[:300]
