"""FedIT (Zhang et al., "Towards Building the Federated GPT: Federated Instruction Tuning", ICASSP 2024).

FedAvg on LoRA adapters over a frozen pretrained model: each client trains its adapters (and here the
classification head) on its data, the server averages them weighted by sample counts; the base never leaves the
clients and never changes. With ``model.kind: lora_encoder`` the adapters are the model's only shared parameters, so
the method is FedAvg's code: what this entry adds is the name the literature compares against, and the refusal of a
model without adapters.
"""

from __future__ import annotations

from hetfed.algorithms.fedavg import FedAvg
from hetfed.algorithms.registry import AlgorithmSpec, Capabilities, PrivacyRow, register


class FedIT(FedAvg):
    """FedAvg whose shared parameters are LoRA adapters and a head over a frozen encoder."""


register(AlgorithmSpec(
    "fedit", FedIT, "FedAvg on LoRA adapters over a frozen pretrained encoder: adapters and head travel, the base "
    "never does", "Zhang et al. 2024, Towards Building the Federated GPT: Federated Instruction Tuning",
    capabilities=Capabilities(uploads="every adapter's A and B and the head, sample count, training loss",
                              private=True, stacks_runs=True, plain_steps=True, model_kinds=("lora_encoder",),
                              model_reason="it averages LoRA adapters over a frozen encoder: use model.kind "
                                           "lora_encoder with embed.kind wordpiece"),
    model={"kind": "lora_encoder"},
    privacy=(
        PrivacyRow(
            method="FedIT",
            config="`algorithm: fedit` + `model.kind: lora_encoder`",
            params="every adapter's A and B, the head",
            extra="`train_loss`",
            stays="data; the frozen encoder is never sent (every client holds the same copy)",
        ),
    ),
    family="global", venue="ICASSP 2024",
))
