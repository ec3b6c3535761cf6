"""Datasets: loaders for standard files, the bundled default, frozen extractors + cache."""

from hetfed.data.embed import Embedded, embed
from hetfed.data.loading import Dataset, load_dataset

__all__ = ["Dataset", "Embedded", "embed", "load_dataset"]
