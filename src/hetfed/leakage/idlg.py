"""``idlg``: improved DLG (Zhao, Mopuri, Bilen 2020): for a batch of one, the label is read exactly from the last
layer's bias gradient (softmax − onehot: negative only at the true label), then only the sample is optimised."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hetfed.leakage import LeakageAttack, Observed, Reconstruction, label_from_last_layer, register
from hetfed.leakage.dlg import DLGParams, matched


def idlg(observed: Observed, params: DLGParams, gen: torch.Generator) -> Reconstruction:
    if observed.batch != 1:
        raise ValueError(f"idlg reads one sample's label: the update is of a batch of {observed.batch}; expected 1 "
                         "(dlg or inverting_gradients take batches)")
    labels = F.one_hot(label_from_last_layer(observed), observed.model.n_classes).to(torch.float32)
    x = torch.rand((1, *observed.input_shape), generator=gen).requires_grad_(True)
    return matched(observed, x, lambda: labels, [x], params)


register(LeakageAttack("idlg", "update", idlg, DLGParams, "gradient inversion with the label read from the last "
                       "layer's bias gradient (a batch of one)", "Zhao et al. 2020, iDLG", most_samples=1))
