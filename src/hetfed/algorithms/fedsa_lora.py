"""FedSA-LoRA (Guo et al., "Selective Aggregation for Low-Rank Adaptation in Federated Learning", ICLR 2025).

The adapters' A matrices learn what is general and are shared: the server averages them; the B matrices learn what
is client-specific and stay on each client, never uploaded. Each round a client trains its A (from the broadcast),
its own B and the head on its data. Here the classification head is shared with the A matrices (the paper's tasks
fine-tune a language model; a classifier head is not one of its adapters). Every client's B starts at zero, as every
LoRA adapter does, so round 0 is the frozen encoder with a fresh head.
"""

from __future__ import annotations

from hetfed.algorithms._personal import PartlyPersonal
from hetfed.algorithms.registry import AlgorithmSpec, Capabilities, PrivacyRow, register


class FedSALoRA(PartlyPersonal):
    """FedAvg on the adapters' A matrices and the head; each client keeps its own B matrices."""

    def personal_names(self) -> tuple[str, ...]:
        return self.model.lora_names("B")  # type: ignore[attr-defined]  # a lora_encoder (Capabilities.model_kinds)


register(AlgorithmSpec(
    "fedsa_lora", FedSALoRA, "LoRA adapters over a frozen encoder: the A matrices (and the head) shared and averaged, "
    "each client's B matrices its own", "Guo et al. 2025, Selective Aggregation for Low-Rank Adaptation in "
    "Federated Learning",
    capabilities=Capabilities(uploads="every adapter's A and the head, sample count, training loss", private=True,
                              stacks_runs=True,
                              personalises=True, model_kinds=("lora_encoder",),
                              model_reason="it shares LoRA adapters' A matrices: use model.kind lora_encoder with "
                                           "embed.kind wordpiece", whole_model=False),
    model={"kind": "lora_encoder"},
    privacy=(
        PrivacyRow(
            method="FedSA-LoRA",
            config="`algorithm: fedsa_lora` + `model.kind: lora_encoder`",
            params="every adapter's A, the head",
            extra="`train_loss`",
            stays="data; every adapter's B; the frozen encoder (never sent); optimiser state when kept",
        ),
    ),
    family="personalised", venue="ICLR 2025",
))
