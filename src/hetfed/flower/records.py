"""The values that cross the wire, as Flower records.

A :class:`~hetfed.engine.types.Broadcast` travels as an ``ArrayRecord`` of
shared parameters (``params``), an ``ArrayRecord`` of tensor extras (e.g.
Fed-FSNet's synthetic samples) and a ``ConfigRecord`` of scalars (round, lr, β).
A client's :class:`~hetfed.engine.types.Upload` comes back as an ``ArrayRecord``
of its shared parameters plus a ``MetricRecord`` with its sample count and the
method's documented extras (training loss, Fed-FSNet's input moments) — nothing
else. Evaluation replies are ``MetricRecord`` s of per-client metrics.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from hetfed.engine.types import Broadcast, Upload

#: the ConfigRecord that says which run and method a message belongs to
RUN = "hetfed.run"


def tensors_to_record(tensors: dict[str, torch.Tensor]) -> ArrayRecord:
    return ArrayRecord({k: v.detach().cpu().contiguous() for k, v in tensors.items()})


def record_to_tensors(record: ArrayRecord, device: torch.device | str = "cpu") -> dict[str, torch.Tensor]:
    return {k: v.to(device) for k, v in record.to_torch_state_dict().items()}


def broadcast_to_records(bc: Broadcast) -> dict:
    """``params``, ``bc_arrays`` (tensor extras) and ``bc`` (round, lr, scalar extras, absent extras)."""
    arrays = {k: v for k, v in bc.extra.items() if isinstance(v, torch.Tensor)}
    scalars = {k: v for k, v in bc.extra.items() if isinstance(v, int | float | bool) and not isinstance(v, torch.Tensor)}
    absent = [k for k, v in bc.extra.items() if v is None]
    other = set(bc.extra) - set(arrays) - set(scalars) - set(absent)
    if other:
        raise TypeError(f"broadcast extras {sorted(other)} cannot travel as Flower records (tensors and scalars only)")
    config = {"round": bc.round, "lr": float(bc.lr), **{f"extra.{k}": v for k, v in scalars.items()}}
    if absent:
        config["absent"] = absent
    return {"params": tensors_to_record(bc.params), "bc_arrays": tensors_to_record(arrays), "bc": ConfigRecord(config)}


def records_to_broadcast(content: RecordDict, device: torch.device | str = "cpu") -> Broadcast:
    config = content["bc"]
    extra: dict = {k[len("extra."):]: v for k, v in config.items() if k.startswith("extra.")}
    extra.update(record_to_tensors(content["bc_arrays"], device))
    extra.update({k: None for k in config.get("absent", [])})
    return Broadcast(record_to_tensors(content["params"], device), int(config["round"]), float(config["lr"]), extra)


def upload_to_records(upload: Upload) -> dict:
    """One client's upload (a stack of one): shared params + MetricRecord of count and documented extras."""
    assert len(upload.client_ids) == 1, "a ClientApp uploads for its one client"
    metrics: dict = {"num_samples": float(upload.num_samples[0]), "client": int(upload.client_ids[0])}
    for key, value in upload.extra.items():
        v = value[0].detach().cpu()
        metrics[f"extra.{key}"] = v.reshape(-1).tolist() if v.ndim else float(v)
        if v.ndim:
            metrics[f"shape.{key}"] = list(v.shape)
    return {"params": tensors_to_record({k: v[0] for k, v in upload.params.items()}), "upload": MetricRecord(metrics)}


def records_to_upload(content: RecordDict, dtypes: dict[str, torch.dtype] | None = None) -> Upload:
    """An Upload of one client (stack of one) from its reply."""
    m = content["upload"]
    params = {k: v.unsqueeze(0) for k, v in record_to_tensors(content["params"]).items()}
    extra = {}
    for key, value in m.items():
        if not key.startswith("extra."):
            continue
        name = key[len("extra."):]
        dtype = (dtypes or {}).get(name, torch.float32)
        if isinstance(value, list):
            shape = [int(s) for s in m[f"shape.{name}"]]
            extra[name] = torch.tensor(value, dtype=dtype).reshape(1, *shape)
        else:
            extra[name] = torch.tensor([value], dtype=dtype)
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
