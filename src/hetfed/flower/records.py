"""The values that cross the wire, as Flower records.

A :class:`~hetfed.engine.types.Broadcast` travels as an ``ArrayRecord`` of
shared parameters (``params``), its extras — whatever the algorithm broadcasts:
Fed-FSNet's synthetic samples and β, FedGen's generator (a nested dict) — as an
``ArrayRecord`` of tensors plus a ``ConfigRecord`` of the rest
(:func:`tree_to_records`, one encoding for every algorithm), and a ``ConfigRecord``
with the round and lr. A client's :class:`~hetfed.engine.types.Upload` comes back
as an ``ArrayRecord`` of its shared parameters, a ``MetricRecord`` with its sample
count, and the method's documented extras (training loss, Fed-FSNet's input
moments …) in the same encoding — nothing else. Evaluation replies are
``MetricRecord`` s of per-client metrics.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from hetfed.engine.types import Broadcast, StreamedUpload, Upload
from hetfed.flower.names import (  # noqa: F401 (re-exported)
    CLIENTS,
    EVALUATE_FIRST,
    GAMMA,
    RUN,
    SETUP,
    VIEW_RECORDS,
    VIEWS_AFTER,
    listed,
)


def tensors_to_record(tensors: dict[str, torch.Tensor]) -> ArrayRecord:
    return ArrayRecord({k: v.detach().cpu().contiguous() for k, v in tensors.items()})


def record_to_tensors(record: ArrayRecord, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in record.to_torch_state_dict().items()}


#: separates the levels of a nested extra in a record key (``generator/layers.0.weight``)
SEP = "/"
_ABSENT, _EMPTY = "__absent__", "__empty__"


def _flatten(tree: dict, prefix: str = "") -> dict:
    """A nested dict → ``{"a/b/c": leaf}``; empty dicts are kept as leaves so they come back."""
    out: dict = {}
    for key, value in tree.items():
        if not isinstance(key, str) or SEP in key:
            raise TypeError(f"extra key {key!r} cannot travel as a Flower record: keys are strings without {SEP!r}")
        path = prefix + key
        if isinstance(value, dict) and value:
            out.update(_flatten(value, path + SEP))
        else:
            out[path] = value
    return out


def _unflatten(flat: dict) -> dict:
    tree: dict = {}
    for path, value in flat.items():
        node = tree
        *parents, last = path.split(SEP)
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return tree


def tree_to_records(tree: dict, name: str) -> dict:
    """Any extra an algorithm sends — nested dicts of tensors, numbers, strings, lists of numbers, None —
    as two records: ``{name}.arrays`` (tensors, dtype and shape kept) and ``{name}.values`` (the rest).

    The one description of how extras travel, for broadcasts and uploads alike.
    """
    arrays: dict[str, torch.Tensor] = {}
    values: dict[str, Any] = {}  # what ConfigRecord takes: numbers, strings, lists of them
    absent: list[str] = []
    empty: list[str] = []
    for path, leaf in _flatten(tree).items():
        if isinstance(leaf, torch.Tensor):
            arrays[path] = leaf
        elif leaf is None:
            absent.append(path)
        elif isinstance(leaf, dict):
            empty.append(path)
        elif isinstance(leaf, bool | int | float | str) or (
                isinstance(leaf, list | tuple) and all(isinstance(v, bool | int | float | str) for v in leaf)):
            values[path] = list(leaf) if isinstance(leaf, tuple) else leaf
        else:
            raise TypeError(f"extra {path!r} of type {type(leaf).__name__} cannot travel as a Flower record: "
                            "expected tensors, numbers, strings, lists of them, None, or dicts of these")
    values[_ABSENT], values[_EMPTY] = absent, empty
    return {f"{name}.arrays": tensors_to_record(arrays), f"{name}.values": ConfigRecord(values)}


def number(value: object) -> float:
    """A record's numeric value."""
    if not isinstance(value, int | float):
        raise TypeError(f"expected a number in the record, found {type(value).__name__}")
    return float(value)


def records_to_tree(content: RecordDict, name: str, device: torch.device | str = "cpu") -> dict:
    """The inverse of :func:`tree_to_records`."""
    values: dict[str, Any] = dict(content.config_records[f"{name}.values"])
    flat: dict[str, Any] = {p: None for p in listed(values.pop(_ABSENT, []))}
    flat.update({p: {} for p in listed(values.pop(_EMPTY, []))})
    flat.update(values)
    flat.update(record_to_tensors(content.array_records[f"{name}.arrays"], device))
    return _unflatten(flat)


def broadcast_to_records(bc: Broadcast) -> dict:
    """``params``, the extras (:func:`tree_to_records` as ``bc_extra``), ``bc`` (round, lr) and — a server that
    holds something for each client — the ``personal`` rows of the clients the message is for, in their order
    (the sender slices them: :meth:`Broadcast.for_clients`)."""
    personal = {"personal": tensors_to_record(bc.personal)} if bc.personal else {}
    return {"params": tensors_to_record(bc.params), **tree_to_records(bc.extra, "bc_extra"),
            "bc": ConfigRecord({"round": bc.round, "lr": float(bc.lr)}), **personal}


def records_to_broadcast(content: RecordDict, device: torch.device | str = "cpu",
                         clients: list[int] | None = None) -> Broadcast:
    """The broadcast; its ``personal`` rows (if any) belong to ``clients``, the message's, in order."""
    config = content.config_records["bc"]
    personal = (record_to_tensors(content.array_records["personal"], device)
                if "personal" in content.array_records else {})
    return Broadcast(record_to_tensors(content.array_records["params"], device), int(number(config["round"])),
                     number(config["lr"]),
                     records_to_tree(content, "bc_extra", device), personal,
                     tuple(clients) if personal and clients is not None else None)


def upload_to_records(upload: Upload) -> dict:
    """A node's upload for its clients: their ids and counts, the method's documented extras (one row per
    client), and either every client's shared params (``params``, stacked) or — a cohort reduced on the node
    (:class:`~hetfed.engine.types.StreamedUpload`) — only their weighted mean (``mean``) and how many
    updates the node's screening rejected."""
    meta = MetricRecord({"num_samples": [float(n) for n in upload.num_samples],
                         "clients": [int(k) for k in upload.client_ids]})
    out = {"upload": meta, **tree_to_records(dict(upload.extra), "upload_extra")}
    if isinstance(upload, StreamedUpload):
        out["mean"] = tensors_to_record(upload.mean)
        out["screened"] = MetricRecord({k: int(v) for k, v in upload.screened.items()})
    else:
        out["params"] = tensors_to_record(upload.params)
    return out


def records_to_upload(content: RecordDict, device: torch.device | str = "cpu") -> Upload:
    """The inverse of :func:`upload_to_records`, its tensors on ``device`` (the server's: it screens and sums them
    against its own parameters there, as it does an in-process executor's uploads)."""
    m = content.metric_records["upload"]
    ids = [int(k) for k in listed(m["clients"])]
    counts = torch.tensor(listed(m["num_samples"]), dtype=torch.float32, device=device)
    extra = records_to_tree(content, "upload_extra", device)
    if "mean" in content:
        screened = {k: int(number(v)) for k, v in content.metric_records["screened"].items()}
        return StreamedUpload(ids, {}, counts, extra, screened,
                              record_to_tensors(content.array_records["mean"], device))
    return Upload(ids, record_to_tensors(content.array_records["params"], device), counts, extra)


def reports_to_records(reports: dict[str, list[Any]]) -> dict[str, Any]:
    """A node's evaluation reports, one value per client: numbers in a MetricRecord (a value a client did not
    measure, such as the global test set's when it is not a scorer, listed in ``missing``), per-client arrays
    (a personal model's predictions) in an ArrayRecord as ``key/j``."""
    numbers: dict[str, Any] = {}
    arrays: dict[str, torch.Tensor] = {}
    missing: dict[str, Any] = {}
    for key, values in reports.items():
        if any(isinstance(v, torch.Tensor) for v in values):
            arrays.update({f"{key}{SEP}{j}": v for j, v in enumerate(values) if v is not None})
            missing[key] = [j for j, v in enumerate(values) if v is None]
            continue
        numbers[key] = [float("nan") if v is None else float(v) for v in values]
        missing[key] = [j for j, v in enumerate(values) if v is None]
    return {"metrics": MetricRecord(numbers), "arrays": tensors_to_record(arrays),
            "missing": ConfigRecord({k: v for k, v in missing.items() if v})}


def records_to_reports(content: RecordDict, n: int) -> dict[str, list[Any]]:
    """The inverse of :func:`reports_to_records` for a node's ``n`` clients."""
    missing = {k: set(listed(v)) for k, v in content.config_records["missing"].items()}
    out: dict[str, list[Any]] = {}
    for key, values in content.metric_records["metrics"].items():
        gone = missing.get(key, set())
        out[key] = [None if j in gone else float(v) for j, v in enumerate(listed(values))]
    for path, value in record_to_tensors(content.array_records["arrays"]).items():
        key, j = path.rsplit(SEP, 1)
        out.setdefault(key, [None] * n)[int(j)] = value
    for key in set(missing) - set(out):  # every client of the node left it unmeasured
        out[key] = [None] * n
    if "val_n" in out:
        out["val_n"] = [None if v is None else int(v) for v in out["val_n"]]
    return out


def state_to_record(state: dict[str, torch.Tensor]) -> ArrayRecord:
    return tensors_to_record(state)


def nan_safe(values: list[float]) -> list[float]:
    return [float(v) if np.isfinite(v) else float("nan") for v in values]


def summary_to_records(summaries: list) -> dict:
    """A node's clients' Γ summaries (:class:`hetfed.gamma_summaries.ClientSummary`): count, Σx, Σxxᵀ per
    client, stacked, in float64."""
    return {"summary": ArrayRecord({
        "n": torch.tensor([s.n for s in summaries], dtype=torch.float64),
        "total": torch.as_tensor(np.stack([s.total for s in summaries]), dtype=torch.float64),
        "outer": torch.as_tensor(np.stack([s.outer for s in summaries]), dtype=torch.float64)})}


def records_to_summaries(content: RecordDict) -> list:
    from hetfed.gamma_summaries import ClientSummary

    t = record_to_tensors(content.array_records["summary"])
    return [ClientSummary(float(t["n"][j]), t["total"][j].numpy(), t["outer"][j].numpy()) for j in range(len(t["n"]))]
