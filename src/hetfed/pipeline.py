"""The first half of a run: load → embed → partition → measure.

Kept separate from the CLI so scripts and the engine call the same code.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import numpy as np
from rich.console import Console

from hetfed.config import Config
from hetfed.config_io import typed_leaves
from hetfed.console import stage
from hetfed.data import Dataset, Embedded, embed, load_dataset
from hetfed.heterogeneity import Heterogeneity, measure, with_given_label
from hetfed.partition import Federation, federation_warnings, make_federation

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class Prepared:
    """Embedded data, its federation, and how heterogeneous the clients are."""

    data: Embedded | None  # None where the data lives on the nodes (hetfed.flower.discovery)
    federation: Federation
    heterogeneity: Heterogeneity
    sources: tuple[dict, ...] = ()  # the data files read (path, bytes, sha256)
    warnings: list[str] = field(default_factory=list)  # what makes parts of the report meaningless
    _views: dict[int, dict[str, np.ndarray]] = field(default_factory=dict, repr=False)

    @property
    def notes(self) -> tuple[str, ...]:
        """What loading did (classes kept, Shakespeare's roles and windows, sizes), for the console and the run's
        record; none when the data lives on the nodes (the server loaded nothing)."""
        return self.data.notes if self.data is not None else ()

    def view(self, seed: int) -> dict[str, np.ndarray]:
        """The federation's picture a run keeps (:func:`hetfed.partition.partition_view`): made once for every run
        that shares this preparation (a PCA of up to 5 000 samples: ~0.25 s on Fashion-MNIST)."""
        if seed not in self._views:
            from hetfed.partition import partition_view

            self._views[seed] = partition_view(self.federation, seed)
        return self._views[seed]


@dataclass(frozen=True, eq=False)
class Built:
    """The federation of a config and what it was built from (before any measuring)."""

    data: Embedded  # the embedded data, the server's holdout included
    clients_data: Embedded  # what was partitioned over the clients (the holdout cut off)
    federation: Federation
    sources: tuple[dict, ...] = ()


def build_federation(config: Config, *, progress: bool = True, status: Console | None = None) -> Built:
    """Load, embed, cut the server's holdout, partition: the one path to a config's federation — inside
    :func:`sharing`, built once however many ask (a sweep's check of its first run, then that run's preparation).

    The simulator and every Flower node call this, so they train on the same clients and
    the server's unlabeled holdout (``server_data``) is never any client's data.
    """
    return _once(_resolved_key(config, "federation", FEDERATION_SECTIONS),
                 lambda: _build_federation(config, progress, status))


def _build_federation(config: Config, progress: bool, status: Console | None) -> Built:
    from dataclasses import replace

    from hetfed.server_data import split_off

    ds, data = _once(_key(config, "data", DATA_SECTIONS), lambda: _load(config, progress, status))
    clients_data, server_x, server_y = split_off(data, config)  # the server's share is cut before partitioning
    with stage(status, f"partitioning ({config.partition.kind})"):
        fed = make_federation(clients_data, config.partition, config.seed)
    if server_x is not None:
        fed = replace(fed, server_x=server_x, server_y=server_y)
    return Built(data, clients_data, fed, ds.sources)


def _load(config: Config, progress: bool, status: Console | None) -> tuple[Dataset, Embedded]:
    with stage(status, f"loading {config.dataset.name}"):
        ds = load_dataset(config.dataset)
    with stage(status if config.embed.kind != "identity" else None, f"embedding ({config.embed.kind})"):
        return ds, embed(ds, config.embed, progress=progress)


class _Shared:
    """What a sweep's runs share while it runs (:func:`sharing`), each computed once however many runs ask: the
    loaded and embedded data, one per distinct (dataset, embedding) — every seed of a sweep reads the same data —,
    and the preparations, one per distinct (data, embedding, server holdout, partition, Γ settings, seed) — runs
    that differ only in methods, training or server settings share their clients and Γ. A run's thread waits for
    what another thread is computing (a stacked sweep's runs start together). Shared arrays are shared as a
    preparation's always were between the methods of a run: nothing in a run writes into its data."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.entries: dict[str, tuple[threading.Event, list[Any]]] = {}


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


def share_in_this_process() -> None:
    """From now on, :func:`prepare` in this process computes each distinct preparation once, as inside
    :func:`sharing`: a sweep's worker process, whose runs share what they can as a one-process sweep's runs do.
    They are kept until the process exits (a worker lives as long as its sweep)."""
    global _SHARED
    _SHARED = _SHARED or _Shared()


#: the config's sections loading and embedding depend on (the plugins may register a dataset or an embedding)
DATA_SECTIONS = ("dataset", "embed", "plugins")
#: and those a federation depends on besides: the server's holdout, the partition, the seed
FEDERATION_SECTIONS = (*DATA_SECTIONS, "server_data", "partition", "seed")
#: and a preparation: how Γ is measured
PREPARATION_SECTIONS = (*FEDERATION_SECTIONS, "heterogeneity")


def unread_by_preparation(config: Config, items: list[str] | None) -> list[str]:
    """A note per ``--set`` item (``key=value``) that a preparation does not read (``hetfed partition``'s: it trains
    nothing, so ``train.rounds`` would be silently ignored there). The methods and the server's combine rule are read
    while ``server_data.source`` is ``auto``: they decide whether the server holds data cut from the clients'."""
    reads = (*PREPARATION_SECTIONS, *(("methods", "server") if config.server_data.source == "auto" else ()))
    typed = typed_leaves(items)
    return [f"--set {item} is not read by hetfed partition: it reads only {', '.join(reads)} (the clients and their "
            "heterogeneity); hetfed run reads the rest"
            for item in dict.fromkeys(item for key, item in typed if key.split(".")[0] not in reads)]


def _key(config: Config, what: str, sections: tuple[str, ...], **resolved: Any) -> str:
    """What ``what`` (data, preparation) depends on, as one string: the config's ``sections`` and values resolved
    from it."""
    c = config.model_dump(mode="json")
    return json.dumps({"what": what, **{k: c[k] for k in sections if k in c}, **resolved}, sort_keys=True)


def preparation_key(config: Config) -> str:
    """What a preparation depends on: :data:`PREPARATION_SECTIONS`, whether the server holds data (as
    resolved) and whether it keeps their labels."""
    return _resolved_key(config, "preparation", PREPARATION_SECTIONS)


def _resolved_key(config: Config, what: str, sections: tuple[str, ...]) -> str:
    """:func:`_key` with the server's data as resolved: whether it holds any, and whether it keeps their labels."""
    from hetfed.server_data import labelled, wanted

    return _key(config, what, sections, server_holds=wanted(config), labelled=labelled(config))


def prepare(config: Config, *, progress: bool = True, status: Console | None = None) -> Prepared:
    """Load, embed and partition the data as configured (:func:`build_federation`), and measure the clients —
    or, inside :func:`sharing`, the same preparation another run of the block already made.

    ``status`` (a console, usually stderr) shows each step while it runs.
    """
    return _once(preparation_key(config), lambda: _prepare(config, progress, status))


def _once(key: str, make: Callable[[], T]) -> T:
    """``make()`` — inside :func:`sharing`, computed once per ``key`` however many threads ask (the others wait for
    the first; if it fails, each meets the error itself)."""
    shared = _SHARED
    if shared is None:
        return make()
    with shared.lock:
        entry = shared.entries.get(key)
        mine = entry is None
        if mine:
            entry = shared.entries[key] = (threading.Event(), [])
    done, slot = entry  # type: ignore[misc]
    if not mine:
        done.wait()
        return slot[0] if slot else make()
    try:
        slot.append(make())
    finally:
        if not slot:
            with shared.lock:
                shared.entries.pop(key, None)
        done.set()
    return slot[0]


#: Γ taking this long is told how to leave it out (``heterogeneity.gamma: false``)
SAY_SKIP_AFTER_S = 10.0


def _prepare(config: Config, progress: bool, status: Console | None) -> Prepared:
    built = build_federation(config, progress=progress, status=status)
    data, clients_data, fed = built.data, built.clients_data, built.federation
    h = config.heterogeneity
    what = f"Γ over {fed.n_clients} clients' {h.on} data" if h.gamma else "label skew only: heterogeneity.gamma = false"
    t0 = time.perf_counter()
    with stage(status, f"measuring heterogeneity ({what})"):
        # Γ on the features (for token ids: their bag-of-words view, hetfed.data.tokens)
        clients = [fed.measured_rows(k, h.on) for k in range(fed.n_clients)]
        features = fed.x if clients_data.measure_train is None else clients_data.measure_train
        het = measure(features, fed.y, clients, fed.n_classes, iid_draws=h.iid_draws, iid_max_clients=h.iid_max_clients,
                      estimator=h.estimator, measured_on=h.on, seed=config.seed, given_label=False, of_features=h.gamma)
        t1 = time.perf_counter()
        if h.gamma and h.given_label:
            het = with_given_label(het, features, fed.y, clients, fed.n_classes, iid_draws=h.iid_draws,
                                   iid_max_clients=h.iid_max_clients, estimator=h.estimator, seed=config.seed)
    took, given = time.perf_counter() - t0, time.perf_counter() - t1
    if status is not None and h.gamma and took >= SAY_SKIP_AFTER_S:
        alone = (f" (heterogeneity.given_label=false: Γ(x|y) alone, {given:.0f} s of them)" if given >= took / 2
                 else "")
        status.print(f"note: Γ took {took:.0f} s before the rounds; where Γ is not the question "
                     "(a sweep measures it for every run), --set heterogeneity.gamma=false leaves it out" + alone,
                     soft_wrap=True, markup=False)
    return Prepared(data, fed, het, built.sources, federation_warnings(fed))
