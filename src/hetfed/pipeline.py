"""The first half of a run: load → embed → partition → measure.

Kept separate from the CLI so scripts and the engine call the same code.
"""

from __future__ import annotations

from dataclasses import dataclass

from hetfed.config import Config
from hetfed.data import Embedded, embed, load_dataset
from hetfed.heterogeneity import Heterogeneity, measure
from hetfed.partition import Federation, make_federation


@dataclass(frozen=True, eq=False)
class Prepared:
    """Embedded data, its federation, and how heterogeneous the clients are."""

    data: Embedded
    federation: Federation
    heterogeneity: Heterogeneity


def prepare(config: Config, *, progress: bool = True) -> Prepared:
    """Load, embed and partition the data as configured, and measure the clients."""
    data = embed(load_dataset(config.dataset), config.embed, progress=progress)
    fed = make_federation(data, config.partition, config.seed)
    clients = [fed.client_indices(k) for k in range(fed.n_clients)]
    return Prepared(data, fed, measure(fed.x, fed.y, clients, fed.n_classes))
