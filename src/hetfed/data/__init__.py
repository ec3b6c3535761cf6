"""Datasets: loaders for standard files, the bundled default, frozen extractors + cache."""

from hetfed.data.embed import Embedded, embed
from hetfed.data.registry import LOADERS, Dataset, load_dataset

__all__ = ["LOADERS", "Dataset", "Embedded", "embed", "load_dataset"]
