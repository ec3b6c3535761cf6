"""What the run driver watches a method's round loop with (:class:`~hetfed.executors.simulate.RoundObserver`):
the metrics file (and the trackers it mirrors to), the progress bar and heartbeat, the checkpoints."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from hetfed.engine.evaluate import Evaluation
from hetfed.executors.updates import RoundObserver, SimulationResult
from hetfed.runs.checkpoint import Checkpointer, snapshot
from hetfed.runs.rundir import Heartbeat, MetricsWriter
from hetfed.runs.summary import round_fields


def write_evaluation(writer: MetricsWriter, label: str, rnd: int, ev: Evaluation) -> None:
    """An evaluation's rows in metrics.csv: the summary, then every client's, handed to the OS (a checkpoint makes
    them durable)."""
    writer.write(label, rnd, "summary", "all", ev.metrics)
    writer.write_clients(label, rnd, ev.per_client)
    writer.flush(durable=False)


@dataclass
class MetricsObserver(RoundObserver):
    """Every round's training rows and every evaluation into metrics.csv, under the row ``label``."""

    writer: MetricsWriter
    label: str

    def trained(self, rnd: int, metrics: dict[str, float]) -> None:
        self.writer.write(self.label, rnd, "train", "all", metrics)

    def found_of_clients(self, rnd: int, per_client: dict[str, list[float]]) -> None:
        self.writer.write_clients(self.label, rnd, per_client, split="train")  # a train row a client

    def evaluated(self, rnd: int, ev: Evaluation) -> None:
        write_evaluation(self.writer, self.label, rnd, ev)


#: the rounds the progress bar's rate is measured over (the latest ones)
RATE_ROUNDS = 20


@dataclass
class ProgressObserver(RoundObserver):
    """The progress bar's task moved on, and the heartbeat refreshed, after every round; its rate is the latest
    :data:`RATE_ROUNDS` rounds' (``recent``: each of them, with the training seconds when it ended)."""

    bar: Any
    task: Any
    heartbeat: Heartbeat
    recent: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=RATE_ROUNDS + 1))

    def round_done(self, rnd: int, metrics: dict[str, float] | None, timing: dict[str, float]) -> None:
        if not getattr(self.bar, "disable", False):  # a display that shows nothing (a sweep's runs') is not fed:
            since = self.recent[0] if self.recent else None
            self.bar.update(self.task, completed=rnd, **round_fields(metrics, timing, rnd, since))  # ~40 µs a round
            self.recent.append((rnd, timing["train_s"]))
        self.heartbeat.beat()


@dataclass
class CheckpointObserver(RoundObserver):
    """A resumable checkpoint of method ``index`` (``label``) whenever the loop offers one.

    ``client_keys``: what the method's clients keep between rounds when they live off this process (a resume
    checks it); ``personal_here``: the personalised models live in this process, so the end of personalisation
    is checkpointed too (on Flower they live on the SuperNodes, and a resume redoes personalisation instead)."""

    checkpointer: Checkpointer
    index: int
    label: str
    client_keys: list[str]
    personal_here: bool

    def checkpoint(self, result: SimulationResult, phase: str = "federated") -> None:
        if self.personal_here or phase != "personalised":
            self.checkpointer.save({"index": self.index, "label": self.label, "phase": phase,
                                    "client_keys": self.client_keys, **snapshot(result)})
