"""``loss_threshold``: membership inference by the model's loss on each sample (Yeom, Giacomelli, Fredrikson, Jha,
CSF 2018): a sample the model was trained on tends to have a lower loss. Its score is −loss; any threshold on it is
one point of the ROC (:func:`hetfed.leakage.metrics.membership`)."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from hetfed.leakage import LeakageAttack, Queried, register, stacked
from hetfed.registry import ComponentParams


def loss_threshold(queried: Queried, params: ComponentParams, gen: torch.Generator) -> np.ndarray:
    with torch.no_grad():
        logits = queried.model.forward(stacked(queried.params), queried.x.unsqueeze(0))[0]
        return (-F.cross_entropy(logits, queried.y, reduction="none")).cpu().numpy()


register(LeakageAttack("loss_threshold", "model", loss_threshold, ComponentParams,
                       "membership inference: a lower loss on a sample means it was trained on",
                       "Yeom et al., CSF 2018"))
