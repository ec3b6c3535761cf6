"""The first half of a run: load → embed → partition → measure.

Kept separate from the CLI so scripts and the engine call the same code.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console

from hetfed.config import Config
from hetfed.console import stage
from hetfed.data import Embedded, embed, load_dataset
from hetfed.heterogeneity import Heterogeneity, measure
from hetfed.partition import Federation, federation_warnings, make_federation


@dataclass(frozen=True, eq=False)
class Prepared:
    """Embedded data, its federation, and how heterogeneous the clients are."""

    data: Embedded
    federation: Federation
    heterogeneity: Heterogeneity
    sources: tuple[dict, ...] = ()  # the data files read (path, bytes, sha256)
    warnings: list[str] = field(default_factory=list)  # what makes parts of the report meaningless


@dataclass(frozen=True, eq=False)
class Built:
    """The federation of a config and what it was built from (before any measuring)."""

    data: Embedded  # the embedded data, the server's holdout included
    clients_data: Embedded  # what was partitioned over the clients (the holdout cut off)
    federation: Federation
    sources: tuple[dict, ...] = ()


def build_federation(config: Config, *, progress: bool = True, status: Console | None = None) -> Built:
    """Load, embed, cut the server's holdout, partition: the one path to a config's federation.

    The simulator and every Flower node call this, so they train on the same clients and
    the server's unlabeled holdout (``server_data``) is never any client's data.
    """
    from dataclasses import replace

    from hetfed.server_data import split_off

    with stage(status, f"loading {config.dataset.name}"):
        ds = load_dataset(config.dataset)
    with stage(status if config.embed.kind != "identity" else None, f"embedding ({config.embed.kind})"):
        data = embed(ds, config.embed, progress=progress)
    clients_data, server_x = split_off(data, config)  # the server's unlabeled share is cut before partitioning
    with stage(status, f"partitioning ({config.partition.kind})"):
        fed = make_federation(clients_data, config.partition, config.seed)
    if server_x is not None:
        fed = replace(fed, server_x=server_x)
    return Built(data, clients_data, fed, ds.sources)


class _Shared:
    """Preparations kept while a sweep runs (:func:`sharing`): one per distinct (data, embedding, server holdout,
    partition, Γ settings, seed), computed once however many of the sweep's runs ask — runs that differ only in
    methods, training or server settings share their clients and Γ. A run's thread waits for a preparation another
    thread is computing (a stacked sweep's runs start together)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[str, tuple[threading.Event, list[Prepared]]] = {}


_SHARED: _Shared | None = None


@contextmanager
def sharing() -> Iterator[_Shared]:
    """Within the block, :func:`prepare` computes each distinct preparation once (a sweep's runs share them); the
    preparations are dropped at its end. Nested blocks share the outer one's."""
    global _SHARED
    if _SHARED is not None:
        yield _SHARED
        return
    _SHARED = _Shared()
    try:
        yield _SHARED
    finally:
        _SHARED = None


def preparation_key(config: Config) -> str:
    """What a preparation depends on: the data, its embedding, the server's holdout (as resolved), the partition,
    how Γ is measured, the seed and the plugins that may register a dataset or partitioner."""
    from hetfed.server_data import wanted

    c = config.model_dump(mode="json")
    parts = {k: c[k] for k in ("dataset", "embed", "server_data", "partition", "heterogeneity", "seed", "plugins")
             if k in c}
    return json.dumps({**parts, "server_holds": wanted(config)}, sort_keys=True)


def prepare(config: Config, *, progress: bool = True, status: Console | None = None) -> Prepared:
    """Load, embed and partition the data as configured (:func:`build_federation`), and measure the clients —
    or, inside :func:`sharing`, the same preparation another run of the block already made.

    ``status`` (a console, usually stderr) shows each step while it runs.
    """
    shared = _SHARED
    if shared is None:
        return _prepare(config, progress, status)
    key = preparation_key(config)
    with shared.lock:
        entry = shared.entries.get(key)
        mine = entry is None
        if mine:
            entry = shared.entries[key] = (threading.Event(), [])
    done, slot = entry  # type: ignore[misc]
    if not mine:
        done.wait()
        if slot:
            return slot[0]
        return _prepare(config, progress, status)  # the first attempt failed: this run meets the error itself
    try:
        slot.append(_prepare(config, progress, status))
    finally:
        if not slot:
            with shared.lock:
                shared.entries.pop(key, None)
        done.set()
    return slot[0]


def _prepare(config: Config, progress: bool, status: Console | None) -> Prepared:
    built = build_federation(config, progress=progress, status=status)
    data, clients_data, fed = built.data, built.clients_data, built.federation
    h = config.heterogeneity
    with stage(status, f"measuring heterogeneity (Γ over {fed.n_clients} clients' {h.on} data)"):
        # Γ on the features (for token ids: their bag-of-words view, hetfed.data.tokens)
        clients = [fed.measured_rows(k, h.on) for k in range(fed.n_clients)]
        features = fed.x if clients_data.measure_train is None else clients_data.measure_train
        het = measure(features, fed.y, clients, fed.n_classes, iid_draws=h.iid_draws, iid_max_clients=h.iid_max_clients,
                      estimator=h.estimator, measured_on=h.on, seed=config.seed)
    return Prepared(data, fed, het, built.sources, federation_warnings(fed))
