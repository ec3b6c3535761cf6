"""``label_counts``: the labels of an update's batch, from the last layer's bias gradient alone (after Wainakh et
al., PETS 2022, "User-level label leakage from gradients"; Ma et al. 2022, iLRG). For the mean cross-entropy of a
batch of B, that gradient is p̄ − n/B (p̄ the batch's mean softmax, n the label counts), so n = B·(p̄ − g). p̄ is
estimated as the model's mean softmax on random inputs — close to the batch's for a model early in training — and
the counts are rounded to integers that sum to B (largest remainders)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field

from hetfed.leakage import LeakageAttack, Observed, Reconstruction, register, stacked
from hetfed.registry import ComponentParams


class LabelCountsParams(ComponentParams):
    probes: int = Field(256, ge=1, description="random inputs the batch's mean softmax is estimated on")


def label_counts(observed: Observed, params: LabelCountsParams, gen: torch.Generator) -> Reconstruction:
    g = observed.last_bias_gradient("label_counts").double()
    probes = torch.rand((params.probes, *observed.input_shape), generator=gen)
    with torch.no_grad():
        p = F.softmax(observed.model.forward(stacked(observed.params), probes.unsqueeze(0))[0], -1).mean(0).double()
    counts = (observed.batch * (p - g)).clamp(min=0).numpy()
    whole = np.floor(counts).astype(np.int64)
    short = observed.batch - int(whole.sum())
    if short > 0:  # the largest remainders get the labels still missing
        whole[np.argsort(-(counts - whole), kind="stable")[:short]] += 1
    elif short < 0:
        for c in np.argsort(counts - whole, kind="stable"):
            while short < 0 and whole[c] > 0:
                whole[c] -= 1
                short += 1
    labels = torch.as_tensor(np.repeat(np.arange(len(whole)), whole))
    return Reconstruction(torch.empty((0, *observed.input_shape)), labels, float("nan"))


register(LeakageAttack("label_counts", "update", label_counts, LabelCountsParams,
                       "label-distribution inference: the batch's label counts from the last layer's bias gradient",
                       "Wainakh et al., PETS 2022"))
