"""``ipm``: inner product manipulation (Xie, Koyejo and Gupta, UAI 2020) — every malicious client sends −ε times the
honest updates' mean, so that the aggregate's inner product with the true update turns negative: a small ε hides
among the honest updates from the median and Krum, a large one overwhelms the mean.

Omniscient, as in the paper and in Karimireddy et al.'s code (epfml/byzantine-robust-noniid-optimizer,
``IPMAttack``): the mean is taken over the round's honest updates — under ``knowledge: partial`` over the
malicious clients' own updates as they trained them.
"""

from __future__ import annotations

import torch
from pydantic import Field

from hetfed.engine.attacks import ClientAttack, ColludingParams, Honest, register


class IpmParams(ColludingParams):
    epsilon: float = Field(0.1, gt=0, description="ε: the malicious update is −ε × the honest mean")


def ipm(honest: Honest, p: IpmParams) -> dict[str, torch.Tensor]:
    return {k: -p.epsilon * mean for k, mean in honest.mean.items()}


register(ClientAttack("ipm", "colluding model poisoning: −ε times the honest updates' mean", IpmParams, collude=ipm))
