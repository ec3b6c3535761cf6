"""``nodes``: the data is on the Flower SuperNodes, each serving its own file (:mod:`hetfed.flower.node_data`)."""

from __future__ import annotations

import math

from pydantic import Field, model_validator

from hetfed.config import DatasetConfig
from hetfed.data.datasets import DatasetKind, register
from hetfed.data.loading import Dataset
from hetfed.errors import DataError
from hetfed.registry import ComponentParams


class NodesParams(ComponentParams):
    """The schema every node's file has: stated by the run, checked on each node."""

    features: int | None = Field(None, ge=1, description="the number of feature columns every node's file has")
    classes: list[int | str] | None = Field(
        None, description="the label values of the nodes' label columns, in class order (class id = position)")
    global_test: str | None = Field(
        None, description="a labelled test set the server holds (a .csv, .npz or .parquet file on the server's "
        "machine, its features and labels as the nodes' files have them): the server's model scores it at every "
        "evaluation (global_* metrics); None: no global test set, only the clients' own test data is scored")
    global_test_label: str = Field("y", description="the label column of dataset.global_test")
    shape: list[int] | None = Field(
        None, description="the shape a row's features take as the models' input, its columns read in C order: "
        "[28, 28] for 28×28 grey images, [32, 32, 3] for colour ones (what an image model, cnn, reads); None: a "
        "vector of dataset.features")

    @model_validator(mode="after")
    def _schema_given(self) -> NodesParams:
        if self.features is None or not self.classes or len(self.classes) < 2:
            raise ValueError(f"dataset.name = 'nodes' needs dataset.features (now {self.features}) and "
                             f"dataset.classes (now {self.classes}): expected the feature-column count and ≥ 2 label "
                             "values every node's file uses, e.g. features: 30, classes: [benign, malignant]")
        if len({str(c) for c in self.classes}) != len(self.classes):
            raise ValueError(f"dataset.classes = {self.classes} repeats a label: expected each class once")
        if self.shape is not None and (not self.shape or min(self.shape) < 1
                                       or math.prod(self.shape) != self.features):
            raise ValueError(f"dataset.shape = {self.shape} is not allowed with dataset.features = {self.features}: "
                             "expected positive sizes whose product is dataset.features, e.g. [28, 28] for 784")
        return self

    def input_shape(self) -> tuple[int, ...]:
        """What the models read of a row: ``shape``, or the vector of ``features``."""
        return tuple(self.shape) if self.shape is not None else (int(self.features or 0),)


def load_nodes(cfg: DatasetConfig) -> Dataset:
    """``nodes``: the data is on the SuperNodes (:mod:`hetfed.flower.node_data`); nothing here can load it."""
    raise DataError("dataset.name = 'nodes' cannot be loaded here: each SuperNode serves its own file; run the config "
                    "on a deployment (`hetfed flower run CONFIG --deployment DIR --out DIR`) whose nodes were started "
                    "with --node-config 'data=\"/path/file.csv\" label=\"y\"'")


register(DatasetKind("nodes", load_nodes, "the SuperNodes' own files: nothing is loaded here (hetfed flower run "
                     "--deployment)", "vector", Params=NodesParams, on_nodes=True))
