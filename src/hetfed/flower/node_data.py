"""A SuperNode's own data: a table on the node's disk, its clients, their splits — never seen by the server.

A node of a real federation is started with ``--node-config 'data="/srv/site.csv"
label="diagnosis"'`` (optionally ``client="patient_group"``: a column whose values
are the node's clients, e.g. the users of a silo). It reads the file (CSV, NPZ or
Parquet), checks it against the schema the run's config states
(``dataset.features`` columns, labels among ``dataset.classes``), maps the labels
to the run's class ids, tells the models the shape a row is read in (``dataset.shape``:
an image model's H×W, the columns in C order, as a simulated federation holds its
images), and splits each of its clients' rows into train / val /
test itself, seeded by the run's seed — as :func:`hetfed.partition.make_federation`
splits a natural federation's clients — or as a split column of the file says
(``split="COLUMN"``: a site's own held-out rows, or the simulation's splits in the
files ``hetfed partition --export`` writes). What it builds is a
:class:`~hetfed.partition.Federation` of its own clients only, with no global
test set; every step then runs on it exactly as on a simulated node.

A file that does not fit the schema is refused with a :class:`DataError` naming the
file and the problem; the node's query reply carries it to the server's user.
"""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import numpy as np

from hetfed.config import Config
from hetfed.errors import DataError
from hetfed.partition import Federation, opted_out_mask, split_client

#: the node config's keys: the file, its label column, its client column and its split column (both optional), the
#: node's place among the nodes (optional: :func:`position`) and a file of the global test set (optional: its rows
#: labelled in the same column), which the clients' personalised models score as in a simulation
DATA, LABEL, CLIENT, SPLIT, POSITION, GLOBAL_TEST = "data", "label", "client", "split", "position", "global-test"
#: every key a node config may hold: its own data's (the others need ``data=…``) and a simulated node's block of the
#: federation's clients (:func:`hetfed.flower.node.node_clients`; Flower's simulation sets them)
OWN_KEYS = (DATA, LABEL, CLIENT, SPLIT, POSITION, GLOBAL_TEST)
NODE_KEYS = (*OWN_KEYS, "partition-id", "num-partitions")
#: a split column's values
SPLITS = ("train", "val", "test")


def check_node_config(node_config) -> None:
    """A node config's keys, each one hetfed reads, refused in one line otherwise (a misspelt ``positon=0`` would be
    ignored, and the node's clients numbered by its id): an unknown key, or a key of the node's own data without
    ``data=…`` (a simulated node holds the simulation's clients and global test set)."""
    from hetfed.spelling import did_you_mean

    for key in node_config:
        if key not in NODE_KEYS:
            raise DataError(f"node config {key} = {node_config[key]!r} is not allowed: {did_you_mean(key, NODE_KEYS)}"
                            f"expected one of {', '.join(NODE_KEYS)}")
    if DATA not in node_config:
        for key in OWN_KEYS:
            if key in node_config:
                raise DataError(f"node config {key} = {node_config[key]!r} is not allowed without data=\"FILE\": it "
                                "says how the node reads its own file; a node without one serves the simulation's "
                                "clients (partition-id, num-partitions)")


def own_data(node_config) -> bool:
    """Whether this node serves its own file (``data=…`` in its node config)."""
    return DATA in node_config


def position(node_config) -> int | None:
    """The node's place among the nodes (``position=P``, P ≥ 0; None: not given): the server numbers the clients of
    nodes with a lower position first, so a deployment started again numbers every client as before — and a run's
    clients draw their batches, dropout and initial states from their numbers — instead of in the order of the
    nodes' ids, which Flower draws anew at every start."""
    if POSITION not in node_config:
        return None
    given = node_config[POSITION]
    try:
        value = int(given)
    except (TypeError, ValueError):
        value = -1
    if value < 0 or str(value) != str(given).strip():
        raise DataError(f"node config position = {given!r} is not allowed: expected a whole number ≥ 0 (the node's "
                        "place among the nodes)")
    return value


def read_table(path: str | Path, label: str = "y", client: str | None = None,
               split: str | None = None, what: str = "node data") -> dict[str, np.ndarray]:
    """``x`` (float32 features), ``y`` (labels as read), ``client`` and ``split`` (each when named) of a .csv, .npz
    or .parquet file; every column but the label, client and split columns is a feature. ``what`` the file is, in
    its errors."""
    p = Path(path)
    if not p.is_file():
        raise DataError(f"{what} {str(p)!r} does not exist: expected a .csv, .npz or .parquet file on this machine")
    if p.suffix == ".csv":
        return _read_csv(p, label, client, split, what)
    if p.suffix not in (".npz", ".parquet"):
        raise DataError(f"{what} {str(p)!r}: expected a .csv, .npz or .parquet file")
    from hetfed.data.formats import read_arrays

    d = read_arrays(p, label, client or "client", split or "split")
    out = {"x": np.asarray(d["x"], dtype=np.float32).reshape(len(d["y"]), -1), "y": np.asarray(d["y"])}
    for key, name in (("client", client), ("split", split)):
        if name is not None:
            if key not in d:
                raise DataError(f"{what} {str(p)!r} has no {key} column (node config {key} = {name!r})")
            out[key] = np.asarray(d[key])
    return out


def _read_csv(p: Path, label: str, client: str | None, split: str | None, what: str) -> dict[str, np.ndarray]:
    with open(p, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    if not rows or not rows[0]:
        raise DataError(f"{what} {str(p)!r} is empty: expected a header row and one row per sample")
    header, body = rows[0], [r for r in rows[1:] if r]
    named = [label, *(n for n in (client, split) if n)]
    for name in named:
        if name not in header:
            raise DataError(f"{what} {str(p)!r} has no column {name!r} (columns: {header[:12]}); "
                            "expected the node config's label/client/split columns")
    if not body:
        raise DataError(f"{what} {str(p)!r} has a header but no rows")
    features = [j for j, name in enumerate(header) if name not in named]
    try:
        x = np.asarray([[float(r[j]) for j in features] for r in body], dtype=np.float32)
    except (ValueError, IndexError) as err:
        raise DataError(f"{what} {str(p)!r}: a feature is not a number or a row is short ({err}); "
                        "expected numeric feature columns") from None
    out = {"x": x, "y": np.asarray([r[header.index(label)] for r in body])}
    for key, column in (("client", client), ("split", split)):
        if column:
            out[key] = np.asarray([r[header.index(column)] for r in body])
    return out


def _plain(value: Any) -> Any:
    """A value read from a file as Python's own (numpy's ``np.int64(1)`` as ``1``)."""
    return value.item() if isinstance(value, np.generic) else value


def _as_text(values: Any) -> np.ndarray:
    """A column's values as the text the file holds."""
    return np.asarray([str(_plain(v)) for v in values])


def class_ids(labels: np.ndarray, classes: list, where: str) -> np.ndarray:
    """Each label's index in the run's ``dataset.classes`` (compared as text: ``1`` in a CSV is class ``1``)."""
    names = [str(c) for c in classes]
    index = {n: j for j, n in enumerate(names)}
    text = _as_text(labels)
    # a float column of whole numbers (1.0) names the class 1
    text = np.asarray([t[:-2] if t.endswith(".0") and t[:-2] in index else t for t in text])
    unknown = sorted(set(text.tolist()) - set(index))
    if unknown:
        raise DataError(f"{where}: labels {unknown[:5]} are not in dataset.classes = {names}; expected only those")
    return np.asarray([index[t] for t in text], dtype=np.int64)


def given_splits(column: np.ndarray, parts: list[np.ndarray], names: list[Any], where: str
                 ) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Each client's train, validation and test rows as the file's split column says (in the file's order): the
    splits a site already has — or the simulation's, in the files ``hetfed partition --export`` writes — kept instead
    of drawn. A value other than train / val / test, or a client with no row to train on, is refused."""
    text = _as_text(column)
    unknown = sorted(set(text.tolist()) - set(SPLITS))
    if unknown:
        raise DataError(f"{where} holds {unknown[:3]}: expected only {list(SPLITS)}")
    out = []
    for j, rows in enumerate(parts):
        train, val, test = (rows[text[rows] == name] for name in SPLITS)
        if not len(train):
            raise DataError(f"{where}: client {_plain(names[j])!r} has no train row; expected at least one train row "
                            "a client")
        out.append((train, val, test))
    return out


def checked_rows(table: dict[str, np.ndarray], ds: Any, where: str) -> tuple[np.ndarray, np.ndarray]:
    """A table's features and class ids, checked against the run's schema (``ds``: ``dataset.*`` of ``nodes``):
    some rows, ``dataset.features`` finite features, labels among ``dataset.classes``."""
    x = table["x"]
    if len(x) == 0:
        raise DataError(f"{where} holds no rows")
    if x.shape[1] != ds.features:
        raise DataError(f"{where} has {x.shape[1]} feature columns: expected dataset.features = {ds.features}")
    if not np.isfinite(x).all():
        raise DataError(f"{where} has missing or infinite feature values: expected finite numbers")
    return x, class_ids(table["y"], list(ds.classes or []), where)


def server_test(ds: Any) -> tuple[np.ndarray, np.ndarray]:
    """The server's own labelled test set (``dataset.global_test``, a file on the server's machine; its label column
    ``dataset.global_test_label``), checked as a node's file is: what the server's model scores at every evaluation
    (``global_*``). Empty where none is given."""
    if ds.global_test is None:
        return np.zeros((0, int(ds.features or 0)), np.float32), np.zeros(0, np.int64)
    return checked_rows(read_table(ds.global_test, ds.global_test_label, what="dataset.global_test"), ds,
                        f"dataset.global_test {ds.global_test!r}")


def node_federation(node_config, config: Config) -> Federation:
    """The node's clients from its own file, checked against the run's schema and split train/val/test (by its
    split column when the node config names one, else drawn as the natural partition draws it)."""
    ds = config.dataset.params
    path = str(node_config[DATA])
    client = str(node_config[CLIENT]) if CLIENT in node_config else None
    split = str(node_config[SPLIT]) if SPLIT in node_config else None
    label = str(node_config.get(LABEL, "y"))
    table = read_table(path, label, client, split)
    where = f"node data {path!r}"
    x, y = checked_rows(table, ds, where)
    x_global, y_global = np.zeros((0, x.shape[1]), np.float32), np.zeros(0, np.int64)
    if GLOBAL_TEST in node_config:  # the clients' own models score it (a personalised method's global_* scores)
        test = str(node_config[GLOBAL_TEST])
        x_global, y_global = checked_rows(read_table(test, label, what="node config global-test"), ds,
                                          f"node config global-test {test!r}")
    ids = table.get("client")
    names, owner = np.unique(ids, return_inverse=True) if ids is not None else (np.zeros(1), np.zeros(len(y), int))
    least = getattr(config.partition.params, "natural_min_samples", 1)  # the natural partitioner's floor, if chosen
    kept = [(names[j], p) for j in range(len(names)) if len(p := np.flatnonzero(owner == j)) >= least]
    names, parts = [n for n, _ in kept], [p for _, p in kept]
    if not parts:
        raise DataError(f"{where}: no client holds partition.natural_min_samples = {least} rows")
    rng = np.random.default_rng([config.seed, 0x5B17])  # the natural partition's split, as make_federation does
    splits = ([split_client(p, y, config.partition.val_fraction, config.partition.test_fraction, rng) for p in parts]
              if split is None else given_splits(table["split"], parts, names, f"{where} (split column {split!r})"))
    return Federation(
        x=x, y=y,
        train=tuple(s[0] for s in splits), val=tuple(s[1] for s in splits), test=tuple(s[2] for s in splits),
        x_global_test=x_global, y_global_test=y_global,
        n_classes=len(ds.classes or []), opted_out=opted_out_mask(len(parts), 0.0, rng),
        input_shape=ds.input_shape(), kind="nodes", params={"data": path},
    )
