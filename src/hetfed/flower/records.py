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

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from hetfed.engine.types import Broadcast, Upload

#: the ConfigRecord that says which run and method a message belongs to
RUN = "hetfed.run"
#: the set-up query's request for the client's Γ summary (and the reply's record is "summary")
GAMMA = "hetfed.gamma"


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
    arrays, values, absent, empty = {}, {}, [], []
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


def records_to_tree(content: RecordDict, name: str, device: torch.device | str = "cpu") -> dict:
    """The inverse of :func:`tree_to_records`."""
    values = dict(content[f"{name}.values"])
    flat: dict = {p: None for p in values.pop(_ABSENT, [])}
    flat.update({p: {} for p in values.pop(_EMPTY, [])})
    flat.update(values)
    flat.update(record_to_tensors(content[f"{name}.arrays"], device))
    return _unflatten(flat)


def broadcast_to_records(bc: Broadcast) -> dict:
    """``params``, the extras (:func:`tree_to_records` as ``bc_extra``) and ``bc`` (round, lr)."""
    return {"params": tensors_to_record(bc.params), **tree_to_records(bc.extra, "bc_extra"),
            "bc": ConfigRecord({"round": bc.round, "lr": float(bc.lr)})}


def records_to_broadcast(content: RecordDict, device: torch.device | str = "cpu") -> Broadcast:
    config = content["bc"]
    return Broadcast(record_to_tensors(content["params"], device), int(config["round"]), float(config["lr"]),
                     records_to_tree(content, "bc_extra", device))


def upload_to_records(upload: Upload) -> dict:
    """One client's upload (a stack of one): shared params, its count, and the method's documented extras."""
    assert len(upload.client_ids) == 1, "a ClientApp uploads for its one client"
    meta = MetricRecord({"num_samples": float(upload.num_samples[0]), "client": int(upload.client_ids[0])})
    extra = {k: v[0] for k, v in upload.extra.items()}
    return {"params": tensors_to_record({k: v[0] for k, v in upload.params.items()}), "upload": meta,
            **tree_to_records(extra, "upload_extra")}


def records_to_upload(content: RecordDict) -> Upload:
    """An Upload of one client (stack of one) from its reply."""
    m = content["upload"]
    params = {k: v.unsqueeze(0) for k, v in record_to_tensors(content["params"]).items()}
    extra = {k: v.unsqueeze(0) for k, v in records_to_tree(content, "upload_extra").items()}
    return Upload([int(m["client"])], params, torch.tensor([m["num_samples"]], dtype=torch.float32), extra)


def reports_to_records(reports: dict[str, list]) -> dict:
    """One client's evaluation reports: numbers in a MetricRecord, prediction arrays in an ArrayRecord."""
    numbers, arrays = {}, {}
    for key, values in reports.items():
        (value,) = values
        if value is None:  # not measured by this client (e.g. it did not score the global test set)
            continue
        if isinstance(value, torch.Tensor):
            arrays[key] = value
        else:
            numbers[key] = float(value)
    return {"metrics": MetricRecord(numbers), "arrays": tensors_to_record(arrays)}


def records_to_reports(content: RecordDict) -> dict[str, list]:
    out: dict[str, list] = {k: [float(v)] for k, v in content["metrics"].items()}
    for key, value in record_to_tensors(content["arrays"]).items():
        out[key] = [value]
    if "val_n" in out:
        out["val_n"] = [int(out["val_n"][0])]
    return out


def state_to_record(state: dict[str, torch.Tensor]) -> ArrayRecord:
    return tensors_to_record(state)


def nan_safe(values: list[float]) -> list[float]:
    return [float(v) if np.isfinite(v) else float("nan") for v in values]


def summary_to_records(summary) -> dict:
    """A client's Γ summary (:class:`hetfed.gamma_summaries.ClientSummary`): count, Σx, Σxxᵀ in float64."""
    return {"summary": ArrayRecord({"n": torch.tensor([summary.n], dtype=torch.float64),
                                    "total": torch.as_tensor(summary.total, dtype=torch.float64),
                                    "outer": torch.as_tensor(summary.outer, dtype=torch.float64)})}


def records_to_summary(content: RecordDict):
    from hetfed.gamma_summaries import ClientSummary

    t = record_to_tensors(content["summary"])
    return ClientSummary(float(t["n"][0]), t["total"].numpy(), t["outer"].numpy())
