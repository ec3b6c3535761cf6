"""The simulated clock: how long each client's round takes, so runs report simulated wall-clock time.

A client's round takes ``compute + network``: compute is the samples it trains on (local steps × min(B, n_k))
times its seconds per sample; network is the bytes it receives ÷ its downlink plus the bytes it sends ÷ its
uplink (:mod:`hetfed.server.transport` says how many: compression shrinks them). Each client's speeds are drawn
once from the run seed (``train.clock``: a distribution with the configured median) or read from a file, and
``slow: by_label`` hands the slowest speeds to the clients whose most frequent class is highest — so the slow
clients hold different data, as on a real federation where device and data go together.

A synchronous round lasts as long as its slowest aggregated client; with a ``deadline``, a client that would
take longer is dropped (late) and the round lasts the deadline. ``train.stragglers`` is this clock in
"median client steps": a time per local step per client, no network (its numbers are the same as before the
clock existed). Asynchronous algorithms (:mod:`hetfed.executors.asynchronous`) order their events on it.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from hetfed.config import ClockConfig, StragglerConfig, TrainConfig
from hetfed.engine.latency import LATENCY
from hetfed.engine.local import LocalSchedule
from hetfed.engine.rng import CLOCK, STRAGGLER, numpy_rng
from hetfed.errors import ConfigError

if TYPE_CHECKING:
    from hetfed.partition import Federation

BITS_PER_MBIT = 1e6


def speeds(distribution: str, spread: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """n multipliers of the median (median 1) drawn by the latency model ``distribution`` (``none``: constant)
    with its ``spread`` where it takes one (``train.stragglers``' form of the clock)."""
    model = LATENCY.get("constant" if distribution == "none" else distribution, "train.stragglers.distribution")
    return model.multipliers(model.Params(**({"spread": spread} if "spread" in model.Params.model_fields else {})),
                             n, rng)


def by_label(values: np.ndarray, fed: Federation) -> np.ndarray:
    """``values`` reassigned so the largest go to the clients whose most frequent training class is highest (ties by
    client id): slowness follows the data."""
    y = np.asarray(fed.y)
    majority = np.array([np.bincount(y[idx], minlength=fed.n_classes).argmax() if len(idx) else -1
                         for idx in fed.train])
    order = np.lexsort((np.arange(len(majority)), majority))  # by class, then id
    out = np.empty_like(values)
    out[order] = np.sort(values)
    return out


def read_speeds(path: str, n: int) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """(seconds per sample, uplink Mbit/s or None, downlink Mbit/s or None) per client from a CSV file."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"train.clock.file = {path!r} is not allowed: no such file; expected a CSV with columns "
                          "client, sample_seconds[, uplink_mbps, downlink_mbps]")
    with file.open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    ids = sorted(int(r["client"]) for r in rows) if rows and "client" in rows[0] else []
    if ids != list(range(n)) or "sample_seconds" not in rows[0]:
        raise ConfigError(f"train.clock.file = {path!r} is not allowed: expected a header with client and "
                          f"sample_seconds and one row for each client 0 … {n - 1} ({len(rows)} rows read)")
    rows.sort(key=lambda r: int(r["client"]))

    def column(name: str) -> np.ndarray | None:
        if name not in rows[0] or any(r[name] in ("", None) for r in rows):
            return None
        values = np.array([float(r[name]) for r in rows])
        if not (np.isfinite(values).all() and (values > 0).all()):
            raise ConfigError(f"train.clock.file = {path!r}: column {name} must hold positive numbers")
        return values

    sample = column("sample_seconds")
    assert sample is not None
    return sample, column("uplink_mbps"), column("downlink_mbps")


def check_clock(cfg: ClockConfig, n_clients: int) -> None:
    """Refuse a clock that cannot be built for ``n_clients`` (a file without a row for every client, or with bad
    numbers) — what the run plan calls before any run directory is made."""
    if LATENCY.get(cfg.latency).reads_file:
        read_speeds(cfg.params.file, n_clients)


def step_times(cfg: StragglerConfig, n_clients: int, seed: int) -> np.ndarray:
    """``train.stragglers``: each client's time per local step (median 1), fixed for the run."""
    return speeds(cfg.distribution, cfg.spread, n_clients, numpy_rng(seed, STRAGGLER))


@dataclass(frozen=True)
class Clock:
    """Every client's compute seconds per round and its bandwidths (bytes/s; inf: instant)."""

    compute: np.ndarray  # [K] seconds of a round's local training
    uplink: np.ndarray  # [K] bytes per second
    downlink: np.ndarray  # [K]
    deadline: float | None = None
    unit: str = "s"  # "s", or "steps" (train.stragglers: median client steps)
    #: no model: a round lasts its training exchange's real seconds (``train.clock.latency: wall``, or a federation
    #: whose clients' sizes the server does not know: nodes with their own data)
    wall: bool = False

    @classmethod
    def of(cls, train: TrainConfig, fed: Federation, seed: int, schedule: LocalSchedule) -> Clock:
        """The run's clock from ``train.clock`` (or ``train.stragglers``, its median-step form)."""
        n = fed.n_clients
        steps = np.array([schedule.n_steps(len(i)) for i in fed.train], dtype=np.float64)
        if train.stragglers.distribution != "none":  # the same draws as before the clock: one stream, per step
            inf = np.full(n, np.inf)
            return cls(steps * step_times(train.stragglers, n, seed), inf, inf, train.stragglers.deadline, "steps")
        cfg = train.clock
        rows = np.minimum(schedule.batch_size, np.array([max(len(i), 1) for i in fed.train], dtype=np.float64))
        sample, up, down = _client_speeds(cfg, fed, seed)
        return cls(steps * rows * sample, _bandwidth(up, n), _bandwidth(down, n), cfg.deadline,
                   wall=LATENCY.get(cfg.latency).wall or not fed.sizes_known)

    def times(self, clients: list[int], down_bytes: float, up_bytes: float) -> np.ndarray:
        """Each client's round: compute plus receiving ``down_bytes`` and sending ``up_bytes``."""
        idx = np.asarray(clients, dtype=np.int64)
        return self.compute[idx] + down_bytes / self.downlink[idx] + up_bytes / self.uplink[idx]

    def late(self, clients: list[int], down_bytes: float, up_bytes: float) -> list[int]:
        """The clients whose round would pass the deadline."""
        if self.deadline is None or not clients:
            return []
        t = self.times(clients, down_bytes, up_bytes)
        return [k for k, tk in zip(clients, t, strict=True) if tk > self.deadline]

    def round_time(self, aggregated: list[int], late: bool, down_bytes: float, up_bytes: float,
                   seconds: float = 0.0) -> float:
        """A synchronous round: its slowest aggregated client, or the deadline when a client was late; on the wall
        clock, ``seconds`` (its training exchange's)."""
        if self.wall:
            return seconds
        slowest = float(self.times(aggregated, down_bytes, up_bytes).max()) if aggregated else 0.0
        if late and self.deadline is not None:
            return max(slowest, self.deadline)
        return slowest


def _client_speeds(cfg: ClockConfig, fed: Federation, seed: int
                   ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """Seconds per sample, uplink and downlink Mbit/s (None: instant) of every client."""
    n = fed.n_clients
    model = LATENCY.get(cfg.latency)
    if model.reads_file:
        return read_speeds(cfg.params.file, n)
    rng = numpy_rng(seed, CLOCK)
    sample = cfg.sample_seconds * model.multipliers(cfg.params, n, rng)
    net = np.exp(cfg.network_spread * rng.standard_normal(n)) if cfg.network_spread > 0 else np.ones(n)
    if cfg.slow == "by_label":
        sample = by_label(sample, fed)
        net = 1.0 / by_label(1.0 / net, fed)  # the slow clients have the thin links too
    up = cfg.uplink_mbps * net if cfg.uplink_mbps is not None else None
    down = cfg.downlink_mbps * net if cfg.downlink_mbps is not None else None
    return sample, up, down


def _bandwidth(mbps: np.ndarray | None, n: int) -> np.ndarray:
    """Bytes per second from Mbit/s (None: an infinitely fast link)."""
    if mbps is None:
        return np.full(n, np.inf)
    return mbps * BITS_PER_MBIT / 8


