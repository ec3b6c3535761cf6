"""The first half of a run: load → embed → partition → measure.

Kept separate from the CLI so scripts and the engine call the same code.
"""

from __future__ import annotations

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


def prepare(config: Config, *, progress: bool = True, status: Console | None = None) -> Prepared:
    """Load, embed and partition the data as configured (:func:`build_federation`), and measure the clients.

    ``status`` (a console, usually stderr) shows each step while it runs.
    """
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
