"""``backdoor``: a malicious client stamps a trigger on a share of its training samples and labels them ``target``, so
the global model learns to answer ``target`` whenever the trigger is present while its accuracy on clean data stays
— BadNets' pixel-pattern trigger (Gu et al. 2017) as federated backdoor papers use it (Bagdasaryan et al., AISTATS
2020; Sun et al., "Can you really backdoor federated learning?", 2019). With ``boost`` γ > 1 the client sends γ·Δ,
Bagdasaryan et al.'s *model replacement* (γ = n/η replaces the global model with the backdoored one when the others
have converged).

The trigger, in the model's input space: for images (inputs H×W or H×W×C) the bottom-right ``size``×``size`` square
of every channel set to ``value``; for feature vectors the last ``size`` features. Which samples of a malicious client
are stamped (``round(poison_fraction · its training samples)``) is drawn once from the run seed and the client; its
validation and test samples stay clean, and so does what a personalised method's personal phase (after the rounds)
and a server's inversion attack (``leakage``) train it on: the backdoor is planted in the rounds' updates. Its
success is measured on the global test set's samples of the other classes, stamped: ``backdoor_accuracy`` in every
evaluation (the share the server's model labels ``target``, the attack success rate).

With ``parts`` k > 1 it is Xie et al.'s distributed backdoor (DBA, ICLR 2020): the trigger's pixels (row-major) are
cut in k consecutive parts — a 3×3 square in 3: its three rows — and the j-th malicious client (by id) stamps part
j mod k alone; the test set gets the whole trigger, which no client trained on."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from pydantic import Field

from hetfed.engine.attacks import ClientAttack, Samples, register
from hetfed.registry import ComponentParams


class BackdoorParams(ComponentParams):
    target: int = Field(0, ge=0, description="the class a stamped sample is labelled (and the backdoor answers)")
    poison_fraction: float = Field(0.5, gt=0, le=1, description="the share of a malicious client's training samples "
                                                               "stamped and relabelled")
    size: int = Field(3, ge=1, description="the trigger: the bottom-right size×size square of an image, or a vector's "
                                           "last size features")
    value: float | None = Field(None, description="what the trigger's features are set to (None: the pool's largest "
                                                  "feature value, a white square)")
    boost: float = Field(1.0, gt=0, description="γ: the client sends γ·Δ (> 1: Bagdasaryan et al.'s model "
                                                "replacement, γ = n/η)")
    parts: int = Field(1, ge=1, description="> 1: a distributed backdoor (DBA, Xie et al. 2020): the trigger's pixels "
                                            "cut in this many parts, each malicious client stamping one; the test "
                                            "set gets the whole trigger")


def trigger_features(input_shape: tuple[int, ...], size: int, parts: int = 1, part: int | None = None) -> np.ndarray:
    """The flat feature indices the trigger sets: the bottom-right ``size``×``size`` square of an image (H×W or
    H×W×C; every channel of a pixel), or a vector's last ``size`` features — its pixels in row-major order, cut in
    ``parts`` consecutive parts and ``part`` of them (None: all)."""
    if len(input_shape) >= 2:
        h, w = input_shape[:2]
        channels = int(np.prod(input_shape[2:]))
        pixels = [(i * w + j) for i in range(h - size, h) for j in range(w - size, w)]
        groups = [np.arange(p * channels, (p + 1) * channels) for p in pixels]
    else:
        groups = [np.array([f]) for f in range(input_shape[0] - size, input_shape[0])]
    if part is not None:
        groups = [groups[int(g)] for g in np.array_split(np.arange(len(groups)), parts)[part]]
    return np.concatenate(groups)


def stamp(x: torch.Tensor, input_shape: tuple[int, ...], size: int, value: float, parts: int = 1,
          part: int | None = None) -> torch.Tensor:
    """``x`` (rows flattened from ``input_shape``) with the trigger (:func:`trigger_features`) set to ``value``."""
    out = x.clone()
    out[:, torch.as_tensor(trigger_features(input_shape, size, parts, part), device=x.device)] = value
    return out


def _value(params: BackdoorParams, samples: Samples) -> float:
    return samples.x_max if params.value is None else params.value


def poison_data(x: torch.Tensor, y: torch.Tensor, samples: Samples, params: BackdoorParams
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """A malicious client's training samples: ``round(poison_fraction · m)`` of them, drawn from its own generator,
    stamped and labelled ``target``."""
    chosen = samples.rng.choice(len(y), size=int(round(params.poison_fraction * len(y))), replace=False)
    rows = torch.as_tensor(chosen, dtype=torch.long, device=x.device)
    x, y = x.clone(), y.clone()
    part = samples.rank % params.parts if params.parts > 1 else None
    x[rows] = stamp(x[rows], samples.input_shape, params.size, _value(params, samples), params.parts, part)
    y[rows] = params.target
    return x, y


def backdoor_test(x: torch.Tensor, y: torch.Tensor, samples: Samples, params: BackdoorParams
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """The global test set as the backdoor's success is measured on it: the samples of the other classes, stamped,
    labelled ``target``."""
    keep = y != params.target
    return stamp(x[keep], samples.input_shape, params.size, _value(params, samples)), torch.full_like(y[keep],
                                                                                                       params.target)


def check(params: BackdoorParams, input_shape: tuple[int, ...], n_classes: int, features: bool) -> str | None:
    """Why the data cannot take this backdoor (None: it can)."""
    if not features:
        return "its trigger is stamped on real-valued features, and these inputs are token ids or text; expected " \
               "image or feature inputs (embed.kind 'identity' or an extractor)"
    if params.target >= n_classes:
        return f"attack.target = {params.target} is not a class of the data; expected 0 … {n_classes - 1}"
    side = min(input_shape[:2]) if len(input_shape) >= 2 else (input_shape[0] if input_shape else 0)
    if params.size > side:
        return f"attack.size = {params.size} does not fit inputs of shape {input_shape}; expected ≤ {side}"
    pixels = params.size ** 2 if len(input_shape) >= 2 else params.size
    if params.parts > pixels:
        return f"attack.parts = {params.parts} cuts a trigger of {pixels} pixels into empty parts; expected ≤ {pixels}"
    return None


def _boosted(delta: torch.Tensor, params: Any, noise: Any) -> torch.Tensor:
    return delta if params.boost == 1 else params.boost * delta


register(ClientAttack("backdoor", "data poisoning: a trigger stamped on a share of the samples, labelled a target "
                      "class (BadNets); boost > 1: model replacement", BackdoorParams, poison=_boosted,
                      poison_data=poison_data, backdoor_test=backdoor_test, check=check))
