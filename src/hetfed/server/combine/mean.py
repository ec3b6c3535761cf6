"""FedAvg's sample-weighted mean (McMahan et al. 2017): the rule that streams (running sums)."""

from __future__ import annotations

import torch

from hetfed.engine.types import Params, StreamedUpload, Upload
from hetfed.server.combine import CombineRule, RuleParams, Weighed, register


def weighted_mean(old: Params, upload: Upload, uniform: bool = False) -> Params:
    """The (sample-weighted, or uniform) mean of the uploaded shared parameters."""
    if isinstance(upload, StreamedUpload):
        return {k: upload.mean[k].to(v.dtype) for k, v in old.items()}
    if len(upload.client_ids) == 1:  # w / Σw = 1 exactly: the row itself (an asynchronous server's every arrival)
        return {k: upload.params[k][0].clone() for k in old}
    w = torch.ones_like(upload.num_samples) if uniform else upload.num_samples
    w = (w / w.sum()).unsqueeze(0)
    mean = {}
    for k in old:  # w [1, n] @ rows [n, size]: torch.tensordot(w, rows, dims=1)'s product, without its ~40 µs of Python
        rows = upload.params[k]
        mean[k] = (w.to(rows.dtype) @ rows.reshape(len(rows), -1)).reshape(rows.shape[1:])
    return mean


def mean(old: Params, upload: Upload, _params: RuleParams) -> Weighed:
    """The rule: each update weighted by its sample count."""
    return Weighed(weighted_mean(old, upload), upload.num_samples / upload.num_samples.sum())


register(CombineRule("mean", mean, RuleParams, streams=True,
                     summary="the sample-weighted mean (FedAvg)", paper="McMahan et al. 2017"))
