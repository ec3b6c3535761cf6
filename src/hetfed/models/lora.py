"""A frozen pretrained encoder with LoRA adapters, stacked over a client axis (multi-LoRA batching).

The base — a Hugging Face encoder (BERT-like: all-MiniLM-L6-v2 by default) read from a local folder — is loaded
once per process and never trained. Every client owns low-rank adapters on the chosen linear layers (Hu et al.
2022: ``y = W x + b + (α/r)·B A x``, A ``[r, in]``, B ``[out, r]``, as ``peft``'s ``LoraLayer`` lays them out and
initialises them: A Kaiming-uniform, B zero) and a classification head on the mean-pooled last hidden states
(all-MiniLM-L6-v2's own pooling). The adapters and the head are the shared parameters: the server holds and averages
them, the base never travels.

A stack of clients runs the base once over all their batches (``[n·b, L]`` token ids); each adapted layer adds each
client's own low-rank update to its rows with two batched matmuls over the client axis, so n clients train for about
the cost of one n·b batch and the memory holds the base once plus the stack's adapters. The adapted layers read the
adapters of the forward that is running (a thread-local slot: a stacked sweep's runs score on threads of their own).
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager
from contextvars import ContextVar
from typing import Any

import torch
from torch import nn

from hetfed.models.base import Model, Noise, Params, ParamSpec, dense, dropout, fan_in_init, zeros_init
from hetfed.models.scoped import bound

#: layer name → (A [n, r, in], B [n, out, r], scaling, p, noise, gate [n, r] or None, merged [n, out, in] or None)
_ADAPTERS: ContextVar[dict[str, tuple[Any, ...]] | None] = ContextVar("hetfed_lora_adapters", default=None)


def kaiming_a(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """``peft``'s initialisation of A: ``nn.init.kaiming_uniform_(a=√5)``, i.e. U(±1/√in), drawn from ``gen``."""
    return fan_in_init(shape[-1])(gen, shape)


class _Adapted(nn.Module):
    """A frozen linear layer that adds the running forward's adapters (if it has some for this layer)."""

    def __init__(self, base: nn.Linear, name: str):
        super().__init__()
        self.base, self.name = base, name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.base(x)
        adapter = (_ADAPTERS.get() or {}).get(self.name)
        if adapter is None:
            return y
        a, b, scaling, p, noise, gate, merged = adapter
        n = a.shape[0]
        rows = x.reshape(n, -1, x.shape[-1])  # each client's tokens: [n, b·L, in]
        low = torch.bmm(dropout(rows, p, noise), a.transpose(1, 2))  # [n, b·L, r]
        if gate is not None:  # each client's own weight on each rank component: 2σ(v_k), 1 at v_k = 0
            low = low * (2 * torch.sigmoid(gate)).unsqueeze(1)
        update = torch.bmm(low, b.transpose(1, 2)) * scaling
        if merged is not None:  # updates merged into the layer's weight (FLoRA): W + ΔW, ΔW held beside W
            update = update + torch.bmm(rows, merged.transpose(1, 2))
        return y + update.reshape(y.shape)


@functools.lru_cache(maxsize=4)
def load_base(path: str) -> tuple[Any, tuple[str, ...], int]:
    """The pretrained encoder at ``path`` (a folder with ``config.json`` and its weights), frozen, in evaluation mode,
    every linear layer of its encoder wrapped so that a forward may adapt it; its adaptable layers' names and its pad
    token id. Loaded once per process and path."""
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # its per-file loading bars would interleave with hetfed's own progress
    base = AutoModel.from_pretrained(path)
    base.eval()
    base.requires_grad_(False)
    names = []
    for name, module in list(base.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and full.startswith("encoder."):
                setattr(module, child_name, _Adapted(child, full))
                names.append(full)
    return base, tuple(names), int(base.config.pad_token_id or 0)


def adapting(adapters: dict[str, tuple[Any, ...]]) -> AbstractContextManager[dict[str, tuple[Any, ...]]]:
    """The adapters the adapted layers add during the block (this thread only)."""
    return bound(_ADAPTERS, adapters)


def _layer_of(name: str) -> int:
    """The encoder layer a linear layer belongs to (``encoder.layer.3.attention.self.query`` → 3)."""
    parts = name.split(".")
    return int(parts[2]) if len(parts) > 2 and parts[1] == "layer" and parts[2].isdigit() else 0


class FromLayerError(ValueError):
    """``from_layer`` does not fit the encoder (not BERT-like, or no layer of that number above layer 0)."""


class FrozenBelow:
    """An encoder split at layer ``k``: what its embeddings and first ``k`` layers make of each text (frozen and never
    adapted, so the same every time) computed once per distinct text of ids and kept on its device, keyed by the ids'
    bytes; the layers from ``k`` up run on every forward. Memory: texts × length × width floats.

    Runs the encoder's parts as its own forward does (embeddings, its attention mask, its layers in order), through
    BERT-like modules' attributes (``embeddings``, ``encoder.layer``) and transformers' public
    ``masking_utils.create_bidirectional_mask``, which BERT's own forward calls for an encoder:
    ``tests/models/test_lora.py`` checks the split forward against the whole one."""

    def __init__(self, base: Any, k: int) -> None:
        for needed in ("embeddings", "encoder", "config"):
            if not hasattr(base, needed):
                raise FromLayerError(f"expected a BERT-like encoder (embeddings, encoder.layer); "
                                     f"{type(base).__name__} has no {needed!r}")
        if getattr(base.config, "is_decoder", False):
            raise FromLayerError(f"expected an encoder; {type(base).__name__} is configured as a decoder "
                                 "(config.is_decoder), whose causal mask the split does not make")
        layers = len(base.encoder.layer)
        if not 0 < k < layers:
            raise FromLayerError(f"expected 0 (every layer adapted) or 1 to {layers - 1} (the encoder has {layers} "
                                 "layers)")
        self.base, self.k = base, k
        self.kept: dict[bytes, torch.Tensor] = {}
        self._lock = threading.Lock()

    def _mask(self, mask: torch.Tensor, hidden: torch.Tensor) -> Any:
        """The attention mask the encoder's own forward makes of ``mask``, for the attention it was loaded with
        (eager, SDPA …). Positional arguments: transformers 5.0 names the second ``input_embeds``, 5.25
        ``inputs_embeds``."""
        from transformers.masking_utils import create_bidirectional_mask

        return create_bidirectional_mask(self.base.config, hidden, mask.long())

    def lower(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """``[texts, L, d]``: the hidden states after the first ``k`` layers (computed for texts not seen yet)."""
        keys = [row.tobytes() for row in ids.cpu().numpy()]
        with self._lock:
            first: dict[bytes, int] = {}
            for j, key in enumerate(keys):
                if key not in self.kept:
                    first.setdefault(key, j)
            new = list(first.values())
            if new:
                at = torch.as_tensor(new, device=ids.device)
                with torch.no_grad():
                    hidden = self.base.embeddings(input_ids=ids[at])
                    extended = self._mask(mask[at], hidden)
                    for layer in self.base.encoder.layer[: self.k]:
                        hidden = layer(hidden, extended)
                for j, h in zip(new, hidden, strict=True):
                    self.kept[keys[j]] = h
            return torch.stack([self.kept[key] for key in keys])

    def upper(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The layers from ``k`` up on the kept hidden states (with the adapters of the running forward)."""
        extended = self._mask(mask, hidden)
        for layer in self.base.encoder.layer[self.k :]:
            hidden = layer(hidden, extended)
        return hidden


class LoRAEncoder(Model):
    """A frozen pretrained encoder with LoRA adapters on the layers ``targets`` names (the last part of a layer's
    name: ``query``, ``value`` …) and a linear head on its mean-pooled last hidden states. Inputs: token ids of its
    own tokenizer, ``[n, batch, length]`` (padding: the tokenizer's pad id).

    ``client_gates``: every adapter's update is gated per client in CGAU's manner (Rieger et al. 2020): each client
    holds a row ``v`` of its own per adapter (local: created on the client at zero, trained there, never uploaded)
    and its adapter adds ``B diag(2σ(v)) A x`` — at ``v = 0`` (a client never seen in training) the shared adapter
    itself. Unlike CGAU's ``σ(W_g x + b_g + V_g h)`` the gate does not depend on the input: it chooses how much of
    each shared rank component a client uses.

    ``from_layer``: only the encoder's layers from this one up are adapted; the layers below are frozen and unadapted,
    so what they make of a text never changes: it is computed once per distinct text and kept (:class:`FrozenBelow`),
    and every later forward runs the upper layers only."""

    no_per_sample_gradients = ("its frozen encoder's forward is a Hugging Face module, through which per-sample "
                               "gradients (torch.func.vmap) have not been checked")
    no_compile = ("its adapters reach the Hugging Face encoder's layers through a ContextVar, which torch.compile "
                  "does not trace")

    def __init__(self, path: str, max_length: int, n_classes: int, rank: int = 8, alpha: float = 16.0,
                 dropout: float = 0.0, targets: Sequence[str] = ("query", "value"), client_gates: bool = False,
                 from_layer: int = 0):
        self.path, self.max_length, self.n_classes = path, max_length, n_classes
        self.client_gates = client_gates
        self.rank, self.alpha, self.p, self.targets = rank, alpha, dropout, tuple(targets)
        self.scaling = alpha / rank
        base, names, self.pad_id = load_base(path)
        self.below = FrozenBelow(base, from_layer) if from_layer > 0 else None
        self.adapted = tuple(n for n in names if n.rsplit(".", 1)[-1] in self.targets and _layer_of(n) >= from_layer)
        if not self.adapted:
            raise ValueError(f"no linear layer of the encoder at {path} from layer {from_layer} up is named one of "
                             f"{list(self.targets)}")
        self.hidden = int(base.config.hidden_size)
        modules = dict(base.named_modules())
        self._specs = []
        #: each adapted layer's weight shape (out, in)
        self._shapes = [(modules[name].base.out_features, modules[name].base.in_features) for name in self.adapted]
        for i, name in enumerate(self.adapted):
            layer = modules[name].base
            self._specs += [ParamSpec(f"lora{i}.A", (rank, layer.in_features), kaiming_a),
                            ParamSpec(f"lora{i}.B", (layer.out_features, rank), zeros_init)]
            if client_gates:
                self._specs.append(ParamSpec(f"lora{i}.gate", (rank,), zeros_init, local=True))
        self._specs += [ParamSpec("head.weight", (self.hidden, n_classes), fan_in_init(self.hidden)),
                        ParamSpec("head.bias", (n_classes,), fan_in_init(self.hidden))]

    @property
    def base(self) -> Any:
        return load_base(self.path)[0]

    def specs(self) -> list[ParamSpec]:
        return self._specs

    @property
    def head_names(self) -> tuple[str, ...]:
        return ("head.weight", "head.bias")

    @property
    def latent_dim(self) -> int:
        return self.hidden

    def features(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        """The mean of each text's last hidden states over its real tokens, ``[n, batch, hidden]``."""
        n, batch, length = x.shape
        ids = x.reshape(n * batch, length).long()
        mask = ids != self.pad_id
        adapters = {name: (params[f"lora{i}.A"], params[f"lora{i}.B"], self.scaling, self.p, noise,
                           params.get(f"lora{i}.gate"), params.get(f"lora{i}.W"))
                    for i, name in enumerate(self.adapted)}
        with adapting(adapters):
            if self.below is None:
                hidden = self.base(input_ids=ids, attention_mask=mask.long()).last_hidden_state  # [n·b, L, d]
            else:
                hidden = self.below.upper(self.below.lower(ids, mask), mask)
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(1) / weights.sum(1).clamp(min=1.0)
        return pooled.reshape(n, batch, -1)

    def head(self, params: Params, z: torch.Tensor) -> torch.Tensor:
        return dense(z, params["head.weight"], params["head.bias"])

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        return self.head(params, self.features(params, x, noise))

    def activation_floats(self, batch: int) -> int:
        """The activations a training step keeps for the backward, per layer: what autograd saves of a BERT-like
        layer for each token — eleven of its width (queries, keys, values, the context, the attention's output and
        its residual's layer norm in and out, the feed-forward's input and output and their layer norm's), two of
        the feed-forward's (before and after the GELU) and the attention's scores and probabilities over the
        sequence. The gradient reaches the lowest adapter through every layer above it, so the frozen layers keep
        theirs too; below it (``from_layer``) nothing is kept. ``benchmarks/lora_clients.py --memory`` measured
        0.79–0.94 of this per client on all-MiniLM-L6-v2, 1–20 clients of 16 texts × 64 tokens (1.34 for one client
        adapting the top two layers, where a step's fixed costs weigh); an earlier count said half as much."""
        config = self.base.config
        per_token = (11 * config.hidden_size + 2 * config.intermediate_size
                     + 2 * config.num_attention_heads * self.max_length)
        kept = config.num_hidden_layers - (self.below.k if self.below is not None else 0)
        return batch * self.max_length * per_token * kept

    def lora_names(self, matrix: str) -> tuple[str, ...]:
        """Every adapter's ``"A"`` (down-projection), ``"B"`` (up-projection) or ``"gate"`` (a client's own row,
        with ``client_gates``) parameter: what the LoRA methods share, keep or freeze. ``"W"``: the update merged
        into each adapted layer's weight, ``[out, in]``, an input the forward adds when a method passes it (FLoRA's
        merged adapters: no parameter of the model's own)."""
        return tuple(f"lora{i}.{matrix}" for i in range(len(self.adapted)))

    def adapted_shapes(self) -> list[tuple[int, int]]:
        """Each adapted layer's weight shape ``(out, in)``."""
        return list(self._shapes)

    def adapter_floats(self) -> int:
        """One client's adapters (what travels), in floats."""
        return sum(math.prod(s.shape) for s in self._specs if s.name.startswith("lora") and not s.local)
