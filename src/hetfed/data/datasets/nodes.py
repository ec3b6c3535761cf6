"""``nodes``: the data is on the Flower SuperNodes, each serving its own file (:mod:`hetfed.flower.node_data`)."""

from __future__ import annotations

from hetfed.config import DatasetConfig
from hetfed.data.datasets import DatasetKind, register
from hetfed.data.loading import Dataset
from hetfed.errors import DataError


def load_nodes(cfg: DatasetConfig) -> Dataset:
    """``nodes``: the data is on the SuperNodes (:mod:`hetfed.flower.node_data`); nothing here can load it."""
    raise DataError("dataset.name = 'nodes' cannot be loaded here: each SuperNode serves its own file; run the config "
                    "on a deployment (`hetfed flower run CONFIG --deployment DIR --out DIR`) whose nodes were started "
                    "with --node-config 'data=\"/path/file.csv\" label=\"y\"'")


register(DatasetKind("nodes", load_nodes, "the SuperNodes' own files: nothing is loaded here (hetfed flower run "
                     "--deployment)", "vector", reads=("features", "classes"), on_nodes=True))
