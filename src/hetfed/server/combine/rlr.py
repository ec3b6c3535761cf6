"""The robust learning rate (RLR; Ozdayi, Kantarcioglu and Gel, "Defending against backdoors in federated learning
with robust learning rate", AAAI 2021): a backdoor moves coordinates that honest clients leave alone or move the other
way, so the server looks at how many updates agree on each coordinate's sign. Where |Σ_i sign(Δ_i)| — the updates'
signs summed over the round — reaches the threshold θ, the coordinate moves by the sample-weighted mean update as
FedAvg's would; where it does not, it moves the opposite way (its learning rate −1), undoing what a minority pushed.

As the authors' code (``TinfoilHat0/Defending-Against-Backdoors-with-Robust-Learning-Rate``, ``compute_robustLR`` and
``agg_avg``): the sign of a coordinate that did not move is 0, the mean weighted by the clients' sample counts, the
server's learning rate ±1 (hetfed's server optimiser then applies its own to the result). θ counts updates, so it is
set for the round's size: the authors' examples use 4 with 10 clients a round."""

from __future__ import annotations

import torch
from pydantic import Field

from hetfed.engine.types import Params, Upload
from hetfed.server.combine import CombineRule, RuleParams, register
from hetfed.server.combine.mean import weighted_mean


class RLRParams(RuleParams):
    threshold: int = Field(4, ge=1, description="θ: the least |Σ sign(Δ_i)| for which a coordinate moves as the mean "
                                               "(below it, the other way); the authors' examples: 4 of 10 clients")


def robust_lr(old: Params, upload: Upload, params: RLRParams) -> Params:
    mean = weighted_mean(old, upload)
    out = {}
    for k, ref in old.items():
        rows = upload.params[k]
        agree = torch.sign(rows - ref.to(rows.device)).sum(0).abs()
        rate = torch.where(agree >= params.threshold, 1.0, -1.0).to(mean[k].dtype)
        out[k] = ref.to(mean[k].device) + rate * (mean[k] - ref.to(mean[k].device))
    return out


register(CombineRule("rlr", robust_lr, RLRParams, streams=False,
                     summary="the sample-weighted mean, each coordinate moved the other way where fewer than θ "
                             "updates agree on its sign (robust learning rate, against backdoors)",
                     paper="Ozdayi et al. 2021"))
