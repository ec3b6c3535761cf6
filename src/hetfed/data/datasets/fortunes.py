"""``fortunes``: Debian's fortune files, one class per category (text)."""

from __future__ import annotations

import numpy as np
from pydantic import Field

from hetfed.config import DatasetConfig
from hetfed.data.datasets import DatasetKind, register
from hetfed.data.loading import (
    Dataset,
    file_record,
    find_folder,
    found,
    require_splittable,
    split_fixed,
)
from hetfed.registry import ComponentParams

#: the four largest categories of Debian's fortunes (1 251, 1 204, 1 134 and 1 051 texts): a 4-class task
FORTUNE_CATEGORIES = ("people", "definitions", "cookie", "computers")


class FortunesParams(ComponentParams):
    categories: list[str] | None = Field(
        None, description="the category files, one class each (default: people, definitions, cookie, computers — "
        "the four largest)")


def load_fortunes(cfg: DatasetConfig) -> Dataset:
    """Debian's fortune files, one class per category (``dataset.categories``); split stratified."""
    from hetfed.data.formats import read_fortune_file

    categories = list(cfg.params.categories or FORTUNE_CATEGORIES)
    folder = find_folder("fortunes", cfg.data_dir, categories)
    texts, labels = [], []
    for c, name in enumerate(categories):
        entries = read_fortune_file(found(folder, name))
        texts += entries
        labels += [c] * len(entries)
    x, y = np.array(texts, dtype=object), np.array(labels, dtype=np.int64)
    require_splittable(y, f"dataset.name = 'fortunes' (categories {categories})", cfg.test_fraction)
    tr, te = split_fixed(x, y, cfg.test_fraction)
    sources = tuple(file_record(found(folder, n)) for n in categories)
    return Dataset("fortunes", x[tr], y[tr], x[te], y[te], len(categories), "text", sources=sources)


register(DatasetKind(
    "fortunes", load_fortunes, "Debian's fortunes: one class per category file (text)", "text",
    Params=FortunesParams, places=("/usr/share/games/fortunes", "~/.cache/hetfed/datasets/fortunes"),
    how_to_get="on Debian/Ubuntu: apt-get install fortunes (the files land in /usr/share/games/fortunes)",
))
