"""FedLC (Zhang et al. 2022, "Federated Learning with Label Distribution Skew via Logits Calibration").

Under label skew a client's local optimum pushes up the logits of the classes it holds many of. FedLC
calibrates each logit before the loss by a label margin that shrinks with the class's local count: a client
``k`` with ``n_{k,c}`` training samples of class ``c`` shifts logit ``z_c`` to ``z_c − τ·n_{k,c}^{−1/4}`` and
descends the cross-entropy of the shifted logits (``params.denominator: all``, the default, as PFLlib's
``clientlc`` computes it):

    L_cal(x, y) = −log( exp(z_y − τ·n_{k,y}^{−1/4}) / Σ_c exp(z_c − τ·n_{k,c}^{−1/4}) )

The paper writes the denominator over the classes ``c ≠ y``, which FL-bench's implementation transcribes
(``denominator: others``). That loss is unbounded below — its gradient in ``z_y`` is −1 whatever the margin —
and on this project's default experiment (digits, lr 0.1, momentum 0.9) it reaches 0.56 global accuracy at round
16 and collapses to one class (0.10) by round 24, where ``all`` trains (docs/methods.md). The counts are the
client's own (the paper's and FL-bench's; PFLlib sums every client's counts on the server); a class the client
does not hold counts as 1e-8 (FL-bench's choice: its logit sits ~100τ lower). The calibration is a training loss
only: the model predicts with its plain logits. The server averages as FedAvg; the counts never leave the client.
"""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F
from pydantic import Field

from hetfed.algorithms.fedavg import FedAvg
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.local import StackObjective, client_mean, row_cross_entropy
from hetfed.engine.types import Broadcast, ClientData, ClientState
from hetfed.models.base import Noise, Params

#: the count of a class a client does not hold (FL-bench's floor)
ABSENT = 1e-8


class FedLCParams(AlgorithmParams):
    tau: float = Field(1.0, gt=0, description="τ, the calibration strength: z_c − τ·n_c^(−1/4) "
                                               "(PFLlib's and FL-bench's default 1.0)")
    denominator: Literal["all", "others"] = Field(
        "all", description="the softmax's classes: all (cross-entropy of the calibrated logits, PFLlib) or the "
        "classes other than the label (the paper's formula as FL-bench computes it; unbounded below)")


def calibrated_loss(logits: torch.Tensor, y: torch.Tensor, counts: torch.Tensor, tau: float,
                    denominator: str = "all") -> torch.Tensor:
    """Each row's calibrated loss ``[n, batch]`` for stacked ``logits`` [n, batch, C], labels ``y`` [n, batch]
    and each client's class counts ``counts`` [n, C]."""
    calibrated = logits - tau * counts.clamp(min=ABSENT).pow(-0.25)[:, None, :]
    true = calibrated.gather(-1, y[..., None]).squeeze(-1)
    if denominator == "others":
        calibrated = calibrated.masked_fill(F.one_hot(y, logits.shape[-1]).bool(), float("-inf"))
    return torch.logsumexp(calibrated, -1) - true


class FedLC(FedAvg):
    """FedAvg whose clients descend the logit-calibrated loss of their own label counts."""

    def _objective(self, bc: Broadcast, data: ClientData, states: ClientState) -> StackObjective:
        return StackObjective(self._loss, {"counts": data.label_counts(self.model.n_classes)})

    def _loss(self, params: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor, noise: Noise,
              inputs: Params) -> tuple[torch.Tensor, torch.Tensor]:
        """The loss calibrated by each client's label counts (``inputs["counts"]``), which it descends, and the
        plain cross-entropy, which it reports (comparable across methods)."""
        logits = self.model.forward(params, xb, noise)
        calibrated = calibrated_loss(logits, yb, inputs["counts"], self.params.tau, self.params.denominator)
        return client_mean(calibrated, mask), client_mean(row_cross_entropy(logits, yb), mask)


register(AlgorithmSpec(
    "fedlc", FedLC, "FedAvg whose clients calibrate their logits by their own label counts (z_c − τ·n_c^(−1/4))",
    "Zhang et al. 2022, Federated Learning with Label Distribution Skew via Logits Calibration", FedLCParams,
    Capabilities(stacks_runs=True, private=True, compact_steps=True),
    privacy=(
        PrivacyRow(
            method="FedLC",
            config="`algorithm: fedlc`",
            params="shared model parameters",
            extra="`train_loss` (its mean cross-entropy)",
            stays="data; its label counts; optimiser state when kept",
        ),
    ),
    family="heterogeneity-specific", venue="ICML 2022",
))
