"""Which registered algorithms run on the default data: its inputs are feature vectors, and the LoRA methods' model
reads a pretrained encoder's token ids (they are run against each other in tests/models/test_lora.py)."""

from __future__ import annotations


def model_reads_features(kind: str) -> bool:
    """Whether model kind ``kind`` reads feature vectors (the default data's inputs)."""
    from hetfed.registry import registry_of

    return registry_of("model").get(kind).inputs == "features"


def reads_features(name: str) -> bool:
    """Whether algorithm ``name`` runs on a model of feature vectors (its ``model_kinds`` allow one, or any)."""
    from hetfed.registry import registry_of

    kinds = registry_of("algorithm").get(name).capabilities.model_kinds
    return kinds is None or any(model_reads_features(k) for k in kinds)
