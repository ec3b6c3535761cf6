"""Record-level differential privacy in a client's local training: DP-SGD (Abadi et al., CCS 2016).

Each step clips every sample's gradient to norm ≤ C, sums them, adds N(0, σ²C²) to each coordinate and divides by
the batch size B. It is written as an objective of :func:`hetfed.engine.local.train_stack`, so every optimiser and
the stacked clients serve it unchanged:

    (1/B) · [ Σ_i c_i ℓ_i(θ) + σC ⟨z, θ⟩ ],   c_i = min(1, C / ‖∇ℓ_i‖)  (held fixed), z ~ N(0, I)

whose gradient is exactly the noised sum of clipped per-sample gradients over B. The per-sample norms come from the
layers' own inputs and output gradients where every trained parameter is a dense layer's weight or bias
(:func:`ghost_norms`: ‖∇W_i‖² = ‖a_i‖²‖g_i‖², ‖∇b_i‖² = ‖g_i‖², one forward and one backward — Goodfellow's trick, as
Opacus's ghost clipping computes them), checked once per model against ``torch.func``'s (a vmap of the gradient over
each client's rows), which serves every other model; the noise from the client's own counter-based
stream (:mod:`hetfed.streams`: its round key, the step, the coordinate), so a client draws the same noise in any
stack and on any device.

Accounting (:func:`record_epsilon`): a client's steps sample B of its n_k records, so each step is a subsampled
Gaussian mechanism with q = B / n_k, composed over every step it took (dp-accounting's RDP). hetfed's batches are
shuffled epochs, not Poisson samples: the accountant models them as Poisson sampling, the approximation Opacus and
TensorFlow Privacy make too. It is not a proven bound for shuffled batches, whose true ε can be larger (Chua et al.,
"How Private are DP-SGD Implementations?", ICML 2024): the ε reported is the Poisson-sampling one. Only the data term
is private: a method's own regulariser (FedProx's, Ditto's
proximal term) reads no sample and is added outside.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.func import grad, vmap

from hetfed import streams
from hetfed.models import sgd_in_backward
from hetfed.models.base import Model, Noise, Params

#: the stream purpose of DP-SGD's noise (beside the batch order, dropout masks and model draws)
RECORD_NOISE = 4


#: per model: whether :func:`ghost_norms` gave :func:`vmap_norms`' numbers on its first step (then it serves it)
_GHOST: weakref.WeakKeyDictionary[Model, bool] = weakref.WeakKeyDictionary()


def per_sample_norms(model: Model, leaves: Params, fixed: Params, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    """‖∇_θ ℓ(θ_j; x_ji, y_ji)‖ over the trained parameters, for every client j and row i → ``[n, batch]``: from the
    dense layers' inputs and output gradients where they give ``torch.func``'s numbers (checked on the model's first
    step, to 1e-4, and whenever the step's trained parameters are all dense layers'), else by ``torch.func``."""
    ok = _GHOST.get(model)
    ghost = None if ok is False else ghost_norms(model, leaves, fixed, xb, yb)
    if ghost is not None and ok:
        return ghost
    reference = vmap_norms(model, leaves, fixed, xb, yb)
    if ok is None:
        ok = _GHOST[model] = ghost is not None and torch.allclose(ghost, reference, rtol=1e-4, atol=1e-6)
    return ghost if ghost is not None and ok else reference


def ghost_norms(model: Model, leaves: Params, fixed: Params, xb: torch.Tensor, yb: torch.Tensor
                ) -> torch.Tensor | None:
    """The per-sample gradient norms from one forward and one backward, when every trained parameter is the weight or
    the bias of exactly one dense layer (:func:`hetfed.models.sgd_in_backward.linear`) and nothing else; None when
    not. A row's loss depends on its own row only, so the gradient of their sum at a layer's output is each row's
    ``g_i``, and its weight's per-sample gradient is ``a_i g_iᵀ``, of norm ``‖a_i‖·‖g_i‖``."""
    with torch.enable_grad():
        trained = {k: v.detach().requires_grad_() for k, v in leaves.items()}
        names = {id(v): k for k, v in trained.items()}
        with sgd_in_backward.recording() as layers:
            logits = model.forward({**fixed, **trained}, xb)
        used = [names.get(id(t)) for _x, w, b, _out in layers for t in (w, b)]
        found = [k for k in used if k is not None]
        rows = all(x.shape[:2] == yb.shape for x, *_rest in layers)  # one row per sample (no tokens flattened)
        if sorted(found) != sorted(trained) or not layers or not rows:
            return None  # a trained parameter outside the dense layers, one used twice, or rows not samples
        loss = F.cross_entropy(logits.flatten(0, 1), yb.flatten().long(), reduction="sum")
        grads = torch.autograd.grad(loss, [out for *_rest, out in layers])
    total = torch.zeros(yb.shape, dtype=torch.float64, device=yb.device)
    for (x, w, b, _out), g in zip(layers, grads, strict=True):
        square = g.detach().double().pow(2).sum(-1)
        if id(w) in names:
            total += x.detach().double().pow(2).sum(-1) * square
        if id(b) in names:
            total += square
    return total.sqrt().to(xb.dtype)


def vmap_norms(model: Model, leaves: Params, fixed: Params, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
    """The per-sample gradient norms by ``torch.func`` (a vmap of the gradient over each client's rows): any model
    ``torch.func`` can differentiate."""
    def one(trained: Params, held: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        params = {k: v.unsqueeze(0) for k, v in {**held, **trained}.items()}
        logits = model.forward(params, x.reshape(1, 1, *x.shape))[0, 0]
        return F.cross_entropy(logits.unsqueeze(0), y.reshape(1))

    rows = vmap(grad(one), in_dims=(None, None, 0, 0))
    grads = vmap(rows, in_dims=(0, 0, 0, 0))({k: v.detach() for k, v in leaves.items()}, fixed, xb, yb)
    return torch.sqrt(sum(g.flatten(2).pow(2).sum(-1) for g in grads.values()))


def gaussian(noise: Noise, like: Params) -> Params:
    """N(0, 1) noise shaped as each stacked parameter, from each client's stream at this step (Box–Muller over two
    uniforms of the stream's bits): coordinate ``c`` of the parameters in name order, all of them in one draw."""
    keys = noise.keys.reshape(-1, 1)
    names = sorted(like)
    counts = [like[k][0].numel() for k in names]
    at = torch.arange(sum(counts), device=keys.device).reshape(1, -1)
    u1 = streams.uniform(keys, RECORD_NOISE, noise.step, 2 * at).clamp(min=1e-7)
    u2 = streams.uniform(keys, RECORD_NOISE, noise.step, 2 * at + 1)
    z = torch.sqrt(-2.0 * torch.log(u1)) * torch.cos(2.0 * math.pi * u2)
    return {k: part.reshape(like[k].shape).to(like[k].dtype)
            for k, part in zip(names, torch.split(z, counts, dim=1), strict=True)}


def private_objective(model: Model, noise_multiplier: float, clip: float, batch_size: int
                      ) -> Callable[[Params, torch.Tensor, torch.Tensor, torch.Tensor, Noise], Any]:
    """The DP-SGD objective of a stacked step: ``(objective per client, the plain mean loss it reports)`` (an
    ``Objective`` of :func:`hetfed.engine.local.train_stack`)."""
    def objective(params: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor,
                  noise: Noise) -> tuple[torch.Tensor, torch.Tensor]:
        leaves = {k: v for k, v in params.items() if v.requires_grad}
        fixed = {k: v.detach() for k, v in params.items() if not v.requires_grad}
        with torch.no_grad():
            scale = (clip / per_sample_norms(model, leaves, fixed, xb, yb).clamp(min=1e-12)).clamp(max=1.0) * mask
        rows = F.cross_entropy(model.forward(params, xb, noise).flatten(0, 1), yb.flatten(), reduction="none")
        rows = rows.view(yb.shape)
        z = gaussian(noise, leaves)
        term = sum((z[k] * leaves[k]).flatten(1).sum(1) for k in leaves) * (noise_multiplier * clip)
        reported = (rows * mask).sum(1) / mask.sum(1).clamp(min=1)
        return ((rows * scale).sum(1) + term) / batch_size, reported.detach()

    return objective


def draws_noise(model: Model, input_shape: Sequence[int]) -> bool:
    """Whether the model's training forward draws random numbers (dropout): DP-SGD's per-sample norms are computed
    without them, so the clip bound would not hold for the gradient that is taken."""
    counter = [0]
    probe = Noise(streams.keys([0], "cpu"), 0, [1], counter=counter)
    params = {k: v.unsqueeze(0) for k, v in {**model.init_shared(torch.Generator().manual_seed(0)),
                                             **model.local_for_unseen_client()}.items()}
    with torch.no_grad():
        model.forward(params, torch.zeros(1, 1, *input_shape), probe)
    return counter[0] > 0


def record_epsilon(noise_multiplier: float, batch_size: int, sizes: Sequence[int], steps: Sequence[int],
                   delta: float) -> float:
    """The largest ε over clients (each: ``steps[k]`` DP-SGD steps sampling B of its ``sizes[k]`` records), for
    ``delta``; 0 before any step."""
    from hetfed.engine.privacy import epsilon

    worst = 0.0
    for n, taken in sorted(set(zip(sizes, steps, strict=True))):
        if taken and n:
            worst = max(worst, epsilon(noise_multiplier, min(1.0, batch_size / n), int(taken), delta))
    return worst
