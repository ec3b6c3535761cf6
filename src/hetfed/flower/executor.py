"""The server side on Flower: an executor that sends the client steps as messages.

:class:`FlowerExecutor` implements the same :class:`~hetfed.executors.inprocess.Executor`
protocol as the in-process executors, so :func:`hetfed.executors.simulate.simulate`
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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from hetfed.config import FlowerConfig, dump_config
from hetfed.engine.types import Broadcast, Seen, Upload
from hetfed.errors import RunError
from hetfed.executors.inprocess import RoundSkipped
from hetfed.flower.exchange import Pushed, poll, push, receive, send_and_receive
from hetfed.flower.packing import pack, unpack_replies
from hetfed.flower.records import (
    CLIENTS,
    EVALUATE_FIRST,
    GAMMA,
    RUN,
    SETUP,
    VIEW_RECORDS,
    VIEWS_AFTER,
    broadcast_to_records,
    listed,
    records_to_reports,
    records_to_summaries,
    records_to_upload,
)
from hetfed.run_spec import RunSpec


class FlowerExecutor:
    """Client steps as Flower messages through a ``Grid`` (Simulation Engine or a SuperLink)."""

    name = "flower"

    def __init__(self, grid: Grid, config, method: int, flower: FlowerConfig | None = None, simulated: bool = False):
        self.grid = grid
        self.simulated = simulated  # the nodes are the Simulation Engine's (Ray's workers), not SuperNodes
        self.config = config
        self.config_text = dump_config(config)
        self.method = method
        self.flower = flower or config.flower
        self.nodes: dict[int, int] = {}  # client id → node id
        self.own = False  # the nodes serve their own data (no global test set: nobody scores one)
        # node id → its first client's id (nodes with their own data number theirs from 0)
        self.offsets: dict[int, int] = {}
        self.failures: list[dict] = []  # {"step", "round", "clients", "errors"}
        self.errors: dict[int, str] = {}  # node → the error its ClientApp raised (this step)
        self.messages = 0
        self.device = torch.device("cpu")  # the server's (start's): where the nodes' uploads are screened and summed
        self.measured_on = config.heterogeneity.on
        #: Γ from the summaries the clients sent at set-up (flower.gamma_summaries), with its (ε, δ) when noised
        self.gamma_summaries: dict | None = None
        self._pending = False  # the set-up question is still to be asked (:meth:`start`)
        self._own_offsets: dict[int, int] = {}
        self._riding: tuple[Broadcast, list[int]] | None = None  # the next round's training, to send with an evaluation
        self._ridden: _Ridden | None = None  # its replies, for the driver's train() call
        self._views: tuple[list[str], list[int]] | None = None  # views to score with the personalisation, by whom
        #: view → (its clients, node → (its clients, the view's records)): replies for the driver's evaluate()
        self._viewed: dict[str, tuple[list[int], dict[int, tuple[list[int], RecordDict]]]] = {}
        #: seconds of the last evaluation exchange that carried the next round's training (the driver counts them
        #: as training: :func:`hetfed.executors.updates.ride_next_round`)
        self.ride_seconds = 0.0
        self._watching: tuple[int, int] | None = None  # (round, client) whose update an attack reads
        self._seen: Seen | None = None

    @property
    def asks_summaries(self) -> bool:
        """Whether the set-up asks each client for its Γ summary: ``flower.gamma_summaries``, unless Γ is not
        measured at all (``heterogeneity.gamma: false``)."""
        return self.flower.gamma_summaries and self.config.heterogeneity.gamma

    # -- set-up: which node holds which clients
    def start(self, run: RunSpec, fed, device: torch.device) -> None:
        """Get ready to ask every SuperNode that connects which clients it holds. The question rides on the run's
        first step (:meth:`_ask`: one exchange fewer per run) when that step's message is the same for every node;
        nodes with their own data (already found by discovery) and SecAgg+ runs are asked now, on their own."""
        self.run, self.algo, self.fed, self.seed, self.device = run, run.algo, fed, run.seed, device
        self._own_offsets = {node: offset for node, offset, _ in getattr(fed, "nodes", ())}  # own data: discovery's
        self.own = bool(self._own_offsets)
        self._hello = query_content(self.config, self.config_text, self.method, self.asks_summaries)
        self._pending = True
        if self.own or self.flower.secure_aggregation != "none":
            self._set_up()

    def _set_up(self, riding: tuple[str, RecordDict, list[int], str] | None = None) -> tuple[dict, dict[int, str]]:
        """Ask every SuperNode that connects which clients it holds, until every client of the federation is
        held (or ``flower.connect_timeout`` passes); the nodes build their data meanwhile. ``riding``: (message
        type, content, the step's clients, its group: the round) — the run's first step, sent with the question; then →
        node → (its
        clients of the step, its reply), and the errors of the nodes whose ClientApp failed the step. A node that
        failed the step or did not answer it in time is asked the question alone, so that its clients are known
        and counted as failed in the step (as they would be in any later step)."""
        self._pending = False
        t0 = time.monotonic()
        deadline = t0 + self.flower.connect_timeout
        kind, hello, group = ("query", self._hello, "") if riding is None else (riding[0], riding[1], riding[3])
        step = set(riding[2]) if riding is not None else set()
        asked: set[int] = set()
        summaries: dict[int, object] = {}
        answered: dict[int, tuple[list[int], RecordDict]] = {}
        errors: dict[int, str] = {}
        failed: set[int] = set()
        own = self._own_offsets
        while True:
            new = sorted(n for n in set(self.grid.get_node_ids()) - asked if not own or n in own)
            if new:
                asked.update(new)
                wait = max(1.0, deadline - time.monotonic())
                step_wait = self.flower.round_timeout  # the step's own (None: for all); the question's at least
                replies = self._send([(n, hello, kind) for n in new], wait if riding is None else
                                     (None if step_wait is None else max(wait, step_wait)), group)
                silent = [n for n in new if replies.get(n) is None] if riding is not None else []
                if silent:  # the step failed there or no answer came: ask the question alone, so that the node's
                    errors.update(self.errors)  # clients are known, and counted as failed in the step
                    replies.update(self._send([(n, self._hello, "query") for n in silent], wait))
                    failed.update(silent)
                for node, reply in replies.items():
                    held = self._held(node, reply, summaries)
                    if riding is not None and node not in failed and held:
                        answered[node] = ([k for k in held if k in step], reply.content)  # type: ignore[union-attr]
            if len(self.nodes) >= self.fed.n_clients or time.monotonic() >= deadline:
                break
            time.sleep(0.2)
        missing = sorted(set(range(self.fed.n_clients)) - set(self.nodes))
        if missing:
            raise RunError(missing_nodes_message(missing, len(asked), self.fed.n_clients, self.flower.connect_timeout,
                                                 time.monotonic() - t0, self.simulated))
        if self.asks_summaries and len(summaries) == self.fed.n_clients:
            self.gamma_summaries = self._gamma(summaries)
        return {node: got for node, got in answered.items() if got[0]}, errors

    def _held(self, node: int, reply: Message | None, summaries: dict) -> list[int]:
        """The clients ``node``'s answer to the set-up question says it holds (recorded; none when it did not
        answer or its own file does not fit the run), and their Γ summaries when it sent them."""
        if reply is None or "error" in reply.content["node"]:
            return []
        self.offsets[node] = self._own_offsets.get(node, 0)
        held = [self.offsets[node] + int(k) for k in listed(reply.content.config_records["node"]["clients"])]
        for k in held:
            self.nodes[k] = node
        if held and "summary" in reply.content:
            summaries.update(zip(held, records_to_summaries(reply.content), strict=True))
        return held

    def _gamma(self, summaries: dict) -> dict:
        """Γ of the federation from its clients' summaries alone (and the summaries' (ε, δ) when noised)."""
        from hetfed.gamma_summaries import (
            gamma_from_summaries,
            private_gamma_report,
            summary_epsilon,
        )

        f = self.flower
        ordered = [summaries[k] for k in sorted(summaries)]
        out = {"gamma": gamma_from_summaries(ordered), "clients": len(summaries),
               "measured_on": self.measured_on, "clip": f.summary_clip, "noise_multiplier": f.summary_noise}
        if f.summary_noise is not None:
            out.update(epsilon=summary_epsilon(f.summary_noise, f.summary_delta) if f.summary_noise > 0 else None,
                       delta=f.summary_delta)
            if f.summary_noise > 0 and f.summary_clip is not None:  # validated: noise needs a clip
                out.update(private_gamma_report(ordered, f.summary_clip, f.summary_noise))
        return out

    # -- messaging
    def _content(self, bc: Broadcast, **extra_config) -> RecordDict:
        records = broadcast_to_records(bc)
        if extra_config:
            records["bc"] = ConfigRecord({**dict(records["bc"]), **extra_config})  # view, scorers
        records[RUN] = ConfigRecord({"config": self.config_text, "method": self.method})
        return RecordDict(records)

    def _send(self, targets: list[tuple[int, RecordDict, str]], timeout: float | None,
              group: str = "") -> dict[int, Message | None]:
        """node → its reply (None when it failed or did not answer in time)."""
        replies = send_and_receive(self.grid, self._messages(targets, group), timeout)
        return self._replies(replies, [node for node, _, _ in targets])

    def _messages(self, targets: list[tuple[int, RecordDict, str]], group: str) -> list[Message]:
        """One message per (node, content, message type)."""
        wire: dict[int, RecordDict] = {}  # each content as it travels, made once (the set-up's goes to every node)
        for _, content, _ in targets:
            if id(content) not in wire:
                wire[id(content)] = pack(content) if self.flower.packed_messages else content
        messages = [Message(wire[id(content)], dst_node_id=node, message_type=kind, group_id=group)
                    for node, content, kind in targets]
        self.messages += len(messages)
        return messages

    def _push(self, targets: list[tuple[int, RecordDict, str]], timeout: float | None, group: str = "") -> Pushed:
        """The messages of :meth:`_send`, pushed now; :meth:`_receive` takes the replies."""
        return push(self.grid, self._messages(targets, group), timeout)

    def _receive(self, pushed: Pushed, nodes: list[int]) -> dict[int, Message | None]:
        """node (of ``nodes``, those pushed to) → its reply (None when it failed or did not answer in time)."""
        return self._replies(receive(self.grid, pushed), nodes)

    def _replies(self, messages: list[Message], nodes: list[int]) -> dict[int, Message | None]:
        """node (of ``nodes``) → its reply among ``messages``, unpacked (None when it failed or did not come); the
        nodes whose ClientApp failed are kept in :attr:`errors`."""
        replies = {m.metadata.src_node_id: m for m in messages}
        unpack_replies(replies.values())
        self.errors = {node: str(r.error.reason or f"error code {r.error.code}")
                       for node, r in replies.items() if r is not None and r.has_error()}
        return {node: (r if r is not None and not r.has_error() else None)
                for node, r in ((node, replies.get(node)) for node in nodes)}

    def _contents(self, bc: Broadcast, clients: list[int], among: list[int] | None = None,
                  decorate: Callable[[list[int], RecordDict], None] | None = None,
                  **extra) -> tuple[dict[int, list[int]], dict[int, RecordDict]]:
        """Which of ``clients`` each node holds, and the node's message content naming them (``decorate``: adds
        what a node's message carries besides, given its clients)."""
        content = self._content(bc, **extra)
        by_node = self._by_node(clients)
        contents = {}
        for node, held in by_node.items():
            # what the server holds for each client goes to its node alone
            message = RecordDict(dict(self._content(bc.for_clients(held), **extra) if bc.personal else content))
            message[CLIENTS] = ConfigRecord({"ids": held, "offset": self.offsets.get(node, 0),
                                             **({"among": among} if among is not None and not self.own else {})})
            if decorate is not None:
                decorate(held, message)
            contents[node] = message
        return by_node, contents

    def _ask(self, step: str, bc: Broadcast, clients: list[int], kind: str, among: list[int] | None = None,
             decorate: Callable[[list[int], RecordDict], None] | None = None,
             **extra) -> dict[int, tuple[list[int], RecordDict]]:
        """One message per node holding some of ``clients``, naming them → node → (its clients, its reply);
        a node that fails fails all its clients of the step."""
        if self._pending and not bc.personal:  # the run's first step: the set-up question rides on it
            content = self._content(bc, **extra)
            content[CLIENTS] = ConfigRecord({"ids": list(clients), "offset": 0,
                                             **({"among": among} if among is not None else {})})
            content[SETUP] = ConfigRecord({})
            if GAMMA in self._hello:
                content[GAMMA] = self._hello.config_records[GAMMA]
            answered, self.errors = self._set_up((kind, content, list(clients), str(bc.round)))
            self._failed(step, bc.round, self._by_node(clients), set(answered))
            return answered
        by_node, contents = self._contents(bc, clients, among, decorate, **extra)
        replies = self._send([(node, c, kind) for node, c in contents.items()], self.flower.round_timeout,
                             str(bc.round))
        answered = {node: (by_node[node], r.content) for node, r in replies.items() if r is not None}
        self._failed(step, bc.round, by_node, set(answered))
        return answered

    def _failed(self, step: str, round: int, by_node: dict[int, list[int]], answered: set[int]) -> None:
        """Record the clients of the nodes that did not answer (:attr:`errors` says which failed and why); stop
        the run when every ClientApp failed, warn when some did."""
        failed = sorted(k for node, held in by_node.items() if node not in answered for k in held)
        if failed:
            errors = {by_node[n][0]: reason for n, reason in self.errors.items() if n in by_node}
            self.failures.append({"step": step, "round": round, "clients": failed, "errors": errors})
            if errors and len(errors) == len(by_node):  # not slow or dead nodes: the ClientApp itself fails
                k, reason = next(iter(sorted(errors.items())))
                raise RunError(f"Flower: every ClientApp failed in step {step!r}, round {round} (client {k}: "
                               f"{_last_line(reason)}); nothing was trained, so the run stops")
            if errors:
                from hetfed.console import make_console

                k, reason = next(iter(sorted(errors.items())))
                make_console(stderr=True).print(
                    f"warning: {len(errors)} ClientApp(s) failed in step {step!r}, round {round} (client {k}: "
                    f"{_last_line(reason)}); counted as failed clients", style="yellow", soft_wrap=True)

    # -- the executor protocol
    def ride(self, bc: Broadcast, clients: list[int]) -> None:
        """The driver's next round (its broadcast and training clients), to send with the evaluation it asks for
        next: one exchange per node for round r's evaluation and round r + 1's training (the node scores the model
        it receives, then trains on it). A SecAgg+ round is four exchanges of its own and rides nothing."""
        if self.flower.secure_aggregation == "none":
            self._riding = (bc, list(clients))

    def train(self, bc: Broadcast, clients: list[int]) -> Upload:
        """The nodes' uploads, screened and summed as in-process: a node's per-client updates go through the
        round's screen; a cohort the node reduced (screened there) is added to the sums as it is. Under secure
        aggregation only their weighted mean reaches the server (:meth:`_train_secure`). A round that rode on the
        evaluation before it (:meth:`ride`) has its replies already."""
        ridden, self._ridden = self._ridden, None
        if ridden is not None:
            if (ridden.round, ridden.clients) != (bc.round, list(clients)):
                raise RuntimeError(f"round {bc.round}'s training was sent with the evaluation before it for round "
                                   f"{ridden.round} and other clients: the driver must run the round it handed over")
            self.errors = ridden.errors
            self._failed("train", bc.round, ridden.by_node, set(ridden.answered))
            answered = ridden.answered
        elif self.flower.secure_aggregation == "secaggplus":
            return self._train_secure(bc, clients)
        else:
            answered = self._ask("train", bc, clients, "train")
        return self._uploads(bc, clients, answered)

    def dispatch(self, bc: Broadcast, clients: list[int]) -> list[Dispatched]:
        """Push ``clients`` their training messages now and return at once, one :class:`Dispatched` per node
        holding some of them: an asynchronous server sends a client its model version when it sends it, so the
        nodes train while the server goes on with other arrivals; :meth:`collect` pulls a node's reply."""
        by_node, contents = self._contents(bc, clients)
        return [Dispatched(bc, node, held, self._push([(node, contents[node], "train")], self.flower.round_timeout,
                                                      str(bc.round)))
                for node, held in by_node.items()]

    def collect(self, sent: Dispatched) -> Upload:
        """The screened upload of a :meth:`dispatch`'s clients, as :meth:`train` returns it: their replies are
        pulled until all came or ``flower.round_timeout`` (from the push) passed."""
        replies = self._receive(sent.pushed, [sent.node])
        answered = {node: (sent.clients, r.content) for node, r in replies.items() if r is not None}
        self._failed("train", sent.bc.round, {sent.node: sent.clients}, set(answered))
        return self._uploads(sent.bc, sent.clients, answered)

    def first_replied(self, sent: list[Dispatched]) -> Dispatched:
        """Of messages pushed (:meth:`dispatch`), the first whose replies all came back — or whose
        ``flower.round_timeout`` passed — in the order they really come (an asynchronous server without a latency
        model: ``train.clock.latency = 'wall'``); its replies are kept for :meth:`collect`."""
        pushes = [d.pushed for d in sent]
        poll(self.grid, pushes, lambda: any(p.done() for p in pushes))
        return next(d for d in sent if d.pushed.done())

    def _uploads(self, bc: Broadcast, clients: list[int], answered: dict[int, tuple[list[int], RecordDict]]
                 ) -> Upload:
        """The nodes' training replies as one upload, screened as in process: a node's per-client updates go
        through the round's screen; compressed ones are decoded first."""
        got = sum(len(held) for held, _ in answered.values())
        if got < min(self.flower.min_replies, len(clients)):
            raise RoundSkipped(bc.round, got, self.flower.min_replies)
        # compressed updates arrive encoded (what travelled): the chain decodes them, then screens
        uploads = [records_to_upload(answered[node][1], self.device)
                   for node in sorted(answered, key=lambda n: answered[n][0][0])]
        self._note_seen(bc, uploads, decode=True)
        return self.run.receiving_encoded(bc.params, uploads)

    def watch(self, bc: Broadcast, client: int) -> Seen | None:
        """Keep what the server receives of ``client``'s update in round ``bc.round`` (an attack reads it): its
        node's reply decoded — its own row, or its cohort's mean where the node summed them — or, under SecAgg+, the
        round's mean. Known only once the replies are in: :meth:`watched` hands it over after :meth:`train`."""
        self._watching, self._seen = (bc.round, client), None
        return None

    def watched(self) -> Seen | None:
        """What :meth:`watch` asked for (None: the client's node did not reply in time)."""
        seen, self._seen, self._watching = self._seen, None, None
        return seen

    def _note_seen(self, bc: Broadcast, uploads: list[Upload], decode: bool) -> None:
        if self._watching is None or self._watching[0] != bc.round:
            return
        client = self._watching[1]
        for upload in uploads:
            if client in upload.client_ids:
                got = self.run.chain.decode(upload, bc.params) if decode else upload
                self._seen = Seen.of(got, client)

    def _train_secure(self, bc: Broadcast, clients: list[int]) -> Upload:
        """A round's training under Flower's SecAgg+ (:mod:`hetfed.flower.secure`): four exchanges, at the end of
        which the server holds the nodes' weighted mean update and their clients' counts — no node's update."""
        from hetfed.flower import secure

        by_node, contents = self._contents(bc, clients)
        if len(by_node) < 2:
            raise RunError(f"flower.secure_aggregation = 'secaggplus' needs the clients of a round on 2 nodes or more; "
                           f"round {bc.round}'s {len(clients)} clients are all on one (a sum of one update hides "
                           "nothing): expected more nodes (flower.clients_per_node) or more clients per round")
        sizes = self.fed.train_sizes()  # empty for nodes with their own data: the server does not know them
        known = ([float(sizes[held].sum()) for held in self._by_node(sorted(self.nodes)).values()]
                 if len(sizes) == self.fed.n_clients else [])
        max_weight = secure.max_weight_for(self.flower.secaggplus, known)

        def send(grid, messages, timeout):
            self.messages += len(messages)
            return send_and_receive(grid, messages, timeout)

        upload, summed, seen = secure.secure_round(self.grid, contents, bc.params, bc.round, self.flower.secaggplus,
                                                   max_weight, self.flower.round_timeout, send)
        self.errors = dict(seen["errors"])
        self._failed("train", bc.round, by_node, set(summed))
        if upload is None:
            raise RoundSkipped(bc.round, 0, self.flower.min_replies)
        if len(upload.client_ids) < min(self.flower.min_replies, len(clients)):
            raise RoundSkipped(bc.round, len(upload.client_ids), self.flower.min_replies)
        if seen["largest"] > self.flower.secaggplus.clipping_range:
            from hetfed.console import make_console

            make_console(stderr=True).print(
                f"warning: round {bc.round}: a node's weighted update reached {seen['largest']:.3g}, beyond "
                f"flower.secaggplus.clipping_range = {self.flower.secaggplus.clipping_range:g}: SecAgg+ clipped it",
                style="yellow", soft_wrap=True)
        self._note_seen(bc, [upload], decode=False)  # the round's mean: all the server ever holds of a client
        uploads = self.run.receiving(bc.params, stream=False)
        uploads.add(upload)
        return uploads.result()

    def ride_views(self, views: list[str], clients: list[int]) -> None:
        """The views the driver scores next, by ``clients``, from the model it personalises: asked in the
        personalisation's exchange (one exchange per node instead of one per view, :meth:`personalise`); their
        replies are kept for :meth:`evaluate`."""
        self._views = (list(views), list(clients))

    def personalise(self, bc: Broadcast, clients: list[int], on_chunk=None) -> dict[str, list[float]]:
        views, self._views = self._views, None
        if views is None or self._pending or bc.personal or not set(views[1]) <= set(clients):
            views = None  # asked on their own (:meth:`evaluate`)
        names, scoring = (views[0], set(views[1])) if views is not None else ([], set())

        def decorate(held: list[int], message: RecordDict) -> None:
            at = [j for j, k in enumerate(held) if k in scoring]
            if at:
                message[VIEWS_AFTER] = ConfigRecord({"views": names, "at": at})

        answered = self._ask("personalise", bc, clients, "train.personalise", decorate=decorate if views else None)
        if views is not None:
            scored = {node: ([k for k in held if k in scoring], content) for node, (held, content) in answered.items()}
            self._viewed = {view: (views[1], {node: (ks, view_records(content, view))
                                              for node, (ks, content) in scored.items() if ks}) for view in names}
        per_client: dict[int, dict[str, float]] = {}
        for held, content in answered.values():
            for key, values in content.metric_records["info"].items():
                for k, value in zip(held, listed(values), strict=True):
                    per_client.setdefault(k, {})[key] = float(value)
        info: dict[str, list[float]] = {}
        for k in clients:
            for key, value in per_client.get(k, {}).items():
                info.setdefault(key, []).append(value)
        if on_chunk:
            on_chunk(len(clients), len(clients))
        return info

    def evaluate(self, bc: Broadcast, clients: list[int], view: str | None = None) -> dict[str, list]:
        viewed = self._viewed.pop(view, None) if view is not None else None
        if viewed is not None and viewed[0] == list(clients):  # scored in the personalisation's exchange
            return self._reports(clients, viewed[1])
        riding, self._riding = self._riding, None
        if riding is not None and view is None:
            return self._evaluate_and_train(bc, clients, *riding)
        extra: dict[str, Any] = {"view": view} if view else {}
        answered = self._ask("evaluate", bc, clients, "evaluate", among=None if view else list(clients), **extra)
        return self._reports(clients, answered)

    def _evaluate_and_train(self, bc: Broadcast, clients: list[int], next_bc: Broadcast,
                            trained: list[int]) -> dict[str, list]:
        """The evaluation of ``bc``'s model by ``clients`` and the next round's training of ``trained`` from
        ``next_bc`` (the same model: the driver hands it over only then) in one ``train`` message per node; the
        training replies are kept for :meth:`train`."""
        by_eval = self._by_node(clients)
        by_train = self._by_node(trained)
        content = None if next_bc.personal else self._content(next_bc)  # one content for all, unless rows per node
        targets = []
        for node in dict.fromkeys([*by_train, *by_eval]):
            fit, score = by_train.get(node, []), by_eval.get(node, [])
            held = fit + [k for k in score if k not in fit]  # the node rebuilds this order for the personal rows
            message = RecordDict(dict(content if content is not None else self._content(next_bc.for_clients(held))))
            message[CLIENTS] = ConfigRecord({"ids": fit, "offset": self.offsets.get(node, 0)})
            message[EVALUATE_FIRST] = ConfigRecord({"ids": score, **({} if self.own else {"among": list(clients)})})
            targets.append((node, message, "train"))
        t0 = time.perf_counter()
        replies = self._send(targets, self.flower.round_timeout, str(next_bc.round))
        self.ride_seconds = time.perf_counter() - t0
        answered = {node: r.content for node, r in replies.items() if r is not None}
        self._ridden = _Ridden(next_bc.round, list(trained), {n: (by_train[n], answered[n]) for n in by_train
                                                               if n in answered}, by_train, dict(self.errors))
        self._failed("evaluate", bc.round, by_eval, set(answered))
        return self._reports(clients, {n: (by_eval[n], answered[n]) for n in by_eval if n in answered})

    def _by_node(self, clients: list[int]) -> dict[int, list[int]]:
        if self._pending:  # a first step the set-up question could not ride on (the nodes' messages differ)
            self._set_up()
        by_node: dict[int, list[int]] = {}
        for k in clients:
            by_node.setdefault(self.nodes[k], []).append(k)
        return by_node

    def _reports(self, clients: list[int], answered: dict[int, tuple[list[int], RecordDict]]) -> dict[str, list]:
        """Each client's evaluation reports from its node's reply, in ``clients``' order (those that answered)."""
        per_client: dict[int, dict[str, object]] = {}
        for held, content in answered.values():
            for key, values in records_to_reports(content, len(held)).items():
                for k, value in zip(held, values, strict=True):
                    per_client.setdefault(k, {})[key] = value
        reports: dict[str, list] = {"client_ids": [k for k in clients if k in per_client]}
        keys = sorted({key for r in per_client.values() for key in r})
        for key in keys:
            reports[key] = [per_client[k].get(key) for k in reports["client_ids"]]
        return reports

    def stop(self) -> None:
        return None


@dataclass(frozen=True)
class Dispatched:
    """A training message an asynchronous server pushed (:meth:`FlowerExecutor.dispatch`): the broadcast, the node
    it went to and its clients there, and the push whose reply :meth:`FlowerExecutor.collect` pulls."""

    bc: Broadcast
    node: int
    clients: list[int]
    pushed: Pushed


@dataclass(frozen=True)
class _Ridden:
    """A round's training replies that came with the evaluation before it: the round, its clients, node → (its
    clients, its reply), every node it asked, and the errors the exchange saw."""

    round: int
    clients: list[int]
    answered: dict[int, tuple[list[int], RecordDict]]
    by_node: dict[int, list[int]]
    errors: dict[int, str]


def view_records(content: RecordDict, view: str) -> RecordDict:
    """A view's evaluation records in a personalisation reply (:data:`VIEW_RECORDS`), under the names an
    evaluation reply gives them (whatever :func:`~hetfed.flower.records.reports_to_records` names them)."""
    prefix = VIEW_RECORDS.format(view=view, name="")
    return RecordDict({key[len(prefix):]: record for key, record in content.items() if key.startswith(prefix)})


def query_content(config, config_text: str, method: int, summaries: bool) -> RecordDict:
    """A ``query`` message's content: the run (its config and method) and, when asked, the request for each
    client's Γ summary. The server's set-up (:meth:`FlowerExecutor.start`) and own-data discovery
    (:func:`hetfed.flower.discovery.discover`) both send it."""
    return RecordDict({RUN: ConfigRecord({"config": config_text, "method": method}),
                       **({GAMMA: summary_request(config)} if summaries else {})})


def summary_request(config) -> ConfigRecord:
    """The set-up query's request for each client's Γ summary: which rows (``heterogeneity.on``), the clip and
    the noise (``flower.summary_*``)."""
    f = config.flower
    request = {"on": config.heterogeneity.on}
    if f.summary_clip is not None:
        request["clip"] = float(f.summary_clip)
    if f.summary_noise is not None:
        request["noise"] = float(f.summary_noise)
    return ConfigRecord(request)


def missing_nodes_message(missing: list[int], asked: int, n_clients: int, timeout: float, waited: float,
                          simulated: bool = False) -> str:
    """Why set-up failed, in one line: the timeout and its value when it passed, how many nodes answered, and what
    to do where the nodes are (the Simulation Engine's workers, or a deployment's SuperNodes)."""
    held = n_clients - len(missing)
    shown = ", ".join(map(str, missing[:10])) + (" …" if len(missing) > 10 else "")
    if waited >= timeout * 0.99:
        todo = ("raise flower.connect_timeout (a loaded machine starts Ray's workers slowly)" if simulated else
                "check that every SuperNode is running (`hetfed flower start` restarts a local deployment), or raise "
                "flower.connect_timeout")
        return (f"Flower: flower.connect_timeout = {timeout:g} s passed with {held} of {n_clients} clients held by the "
                f"{asked} SuperNodes that connected (no node holds clients {shown}): {todo}")
    return (f"Flower: the {asked} SuperNodes that answered hold {held} of {n_clients} clients; none holds clients "
            f"{shown}: expected nodes started with --node-config 'partition-id=P num-partitions=K' for every P in "
            "0..K-1 (node P holds the P-th of K blocks of clients)")


def _last_line(reason: str) -> str:
    """The exception line of a ClientApp's error reply (its reason holds Ray's and Python's tracebacks)."""
    import re

    text = re.sub(r"\x1b\[[0-9;]*m", "", reason.replace("\\n", "\n"))
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    raised = [ln for ln in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt)\b.*:", ln)
              and not ln.startswith(("ray.", "flwr."))]
    return (raised[-1] if raised else lines[-1] if lines else reason)[:300]
