"""``lira``: the Likelihood Ratio Attack (Carlini, Chien, Nasr, Song, Terzis, Tramèr, S&P 2022): membership scored
against what models that never saw a sample make of it (offline, § VI-C) — or, ``online``, against both what models
that saw it and models that did not make of it (§ IV) —, so that a sample that is easy for every model no longer looks
like a member.

``shadows`` models of the target's architecture are trained, each on a random half of the attacker's own data from
the population (``Queried.reference``: in a run, the public global test set, which no client trains on), by plain
SGD; none of them saw the queried samples. For each sample the attack fits a Gaussian to the shadows' logit-scaled
confidence in its label, φ = log p_y − log(1 − p_y), and scores the target's φ by how far above that Gaussian it
lies (the one-sided test of the paper's offline variant). The shadows are trained once per reference set, architecture
and parameters and reused for every model of that architecture queried against them (each client's own, in a
run). The shadows see at most ``references`` of the reference samples (their cost grows with it).
"""

from __future__ import annotations

import weakref
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field
from scipy.stats import norm

from hetfed.leakage import LeakageAttack, Queried, register, stacked
from hetfed.models.base import Model, Params
from hetfed.registry import ComponentParams


class LiRAParams(ComponentParams):
    shadows: int = Field(8, ge=2, description="shadow models (none saw the queried samples)")
    epochs: int = Field(50, ge=1, description="each shadow's epochs over its half of the reference data")
    lr: float = Field(0.1, gt=0, description="the shadows' SGD step size")
    batch_size: int = Field(32, ge=1, description="the shadows' minibatch size")
    references: int = Field(2000, ge=2, description="the attacker's reference samples the shadows draw from, at most")
    online: bool = Field(False, description="shadows trained with half of the queried samples too, each sample "
                                            "scored against those that saw it and those that did not (needs an even "
                                            "number of shadows, at least 4)")


#: shadows kept per reference set (by identity, weakly: they go with it), then by architecture and parameters
_SHADOWS: dict[int, tuple[weakref.ref[torch.Tensor], dict[tuple[str, tuple[Any, ...], str], Params]]] = {}


def phi(model: Model, params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """log p_y − log(1 − p_y) of each stacked model's prediction (``params`` ``[n, …]``) on ``x`` → ``[n, samples]``
    (computed from the logits, stable for confident predictions)."""
    with torch.no_grad():
        logits = model.forward(params, x.unsqueeze(0).expand(len(next(iter(params.values()))), *x.shape))
        own = logits.gather(-1, y.view(1, -1, 1).expand(logits.shape[0], -1, 1)).squeeze(-1)
        others = logits.scatter(-1, y.view(1, -1, 1).expand(logits.shape[0], -1, 1), float("-inf"))
        return own - torch.logsumexp(others, -1)


def random_halves(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """``[k, n // 2]``: each of ``k`` shadows' own random half of ``n`` samples."""
    return torch.stack([torch.randperm(n, generator=gen)[: max(1, n // 2)] for _ in range(k)])


def balanced_halves(n: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """``[k, n // 2]``: for each of ``k`` (even) shadows the samples of ``n`` it trains on, in complementary pairs
    (shadow 2t a random half, 2t + 1 the other half), so every sample is in ``k / 2`` shadows; when ``n`` is odd each
    pair leaves out one sample — a different one per pair while ``n ≥ k / 2`` — so that every shadow trains on as many
    samples, and those are in one shadow fewer."""
    half = n // 2
    left_out = torch.randperm(n, generator=gen)[torch.arange(k // 2) % n]
    rows = []
    for t in range(k // 2):
        pool = torch.arange(n) if n % 2 == 0 else torch.arange(n)[torch.arange(n) != left_out[t]]
        order = pool[torch.randperm(len(pool), generator=gen)]
        rows += [order[:half], order[half : 2 * half]]
    return torch.stack(rows)


def train_shadows(model: Model, x: torch.Tensor, y: torch.Tensor, params: LiRAParams, gen: torch.Generator,
                  subsets: torch.Tensor | None = None) -> Params:
    """``params.shadows`` models, stacked, each trained by plain SGD on its row of ``subsets`` (indices into
    ``(x, y)``; default: its own random half)."""
    k = params.shadows
    inits = [{**model.init_shared(gen), **model.init_local(gen)} for _ in range(k)]  # a shadow trains all of it
    weights = {name: torch.stack([s[name] for s in inits]).to(x.device).requires_grad_(True) for name in inits[0]}
    halves = (random_halves(len(y), k, gen) if subsets is None else subsets).to(x.device)
    half = halves.shape[1]
    steps = max(1, half // params.batch_size)
    for _ in range(params.epochs):
        order = torch.stack([row[torch.randperm(half, generator=gen).to(x.device)] for row in halves])
        for s in range(steps):
            idx = order[:, s * params.batch_size:(s + 1) * params.batch_size]
            logits = model.forward(weights, x[idx])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y[idx].reshape(-1)) * k
            grads = torch.autograd.grad(loss, list(weights.values()))
            with torch.no_grad():
                for w, g in zip(weights.values(), grads, strict=True):
                    w.sub_(params.lr * g)
    return {name: w.detach() for name, w in weights.items()}


def _reference(queried: Queried) -> tuple[torch.Tensor, torch.Tensor]:
    """The attacker's own samples from the population, which the shadows train on."""
    if queried.reference is None:
        raise ValueError("lira trains shadow models on the attacker's own data from the population: "
                         "Queried.reference is None; expected (x, y) the target never trained on")
    return queried.reference


def _at_most(x: torch.Tensor, y: torch.Tensor, params: LiRAParams, gen: torch.Generator
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """At most ``params.references`` of the reference samples, drawn at random (the shadows' cost grows with them)."""
    if len(y) <= params.references:
        return x, y
    part = torch.randperm(len(y), generator=gen)[: params.references].to(x.device)
    return x[part], y[part]


def _shadows(queried: Queried, params: LiRAParams, gen: torch.Generator) -> Params:
    x, y = _reference(queried)
    at = id(x)
    held = _SHADOWS.get(at)
    if held is None or held[0]() is not x:  # a new reference set (a tensor's id may be reused once it is gone)
        held = _SHADOWS[at] = (weakref.ref(x, lambda _: _SHADOWS.pop(at, None)), {})
    kept = held[1]
    model = queried.model  # shadows depend on the architecture alone: methods of one architecture share them
    key = (f"{type(model).__module__}.{type(model).__qualname__}",
           tuple((s.name, tuple(s.shape), s.local) for s in model.specs()), params.model_dump_json())
    if key not in kept:
        kept[key] = train_shadows(queried.model, *_at_most(x, y, params, gen), params, gen)
    return kept[key]


def lira(queried: Queried, params: LiRAParams, gen: torch.Generator) -> np.ndarray:
    if params.online:
        return _online(queried, params, gen)
    shadows = _shadows(queried, params, gen)
    out = phi(queried.model, shadows, queried.x, queried.y).double()  # [shadows, samples]
    mean, std = out.mean(0), out.std(0).clamp(min=1e-3)
    target = phi(queried.model, stacked(queried.params), queried.x, queried.y)[0].double()
    return norm.logcdf(((target - mean) / std).cpu().numpy())  # higher: further above what unseen samples get


def _online(queried: Queried, params: LiRAParams, gen: torch.Generator) -> np.ndarray:
    """Online LiRA: shadows trained with half of the queried samples each; log N(φ; μ_in, σ) − log N(φ; μ_out, σ)
    per sample, σ pooled over the samples and both sides."""
    k = params.shadows
    if k < 4 or k % 2:
        raise ValueError(f"lira with online = true needs an even number of shadows, at least 4: shadows = {k}")
    rx, ry = _at_most(*_reference(queried), params, gen)
    m = len(queried.y)
    held = balanced_halves(m, k, gen)  # [k, size]: the queried samples each shadow trains on
    subsets = torch.cat([random_halves(len(ry), k, gen), held + len(ry)], 1)
    shadows = train_shadows(queried.model, torch.cat([rx, queried.x]), torch.cat([ry, queried.y]), params, gen, subsets)
    seen = torch.zeros(k, m, dtype=torch.bool)
    seen[torch.arange(k).unsqueeze(1), held] = True
    scores = phi(queried.model, shadows, queried.x, queried.y).double().cpu()  # [shadows, samples]
    target = phi(queried.model, stacked(queried.params), queried.x, queried.y)[0].double().cpu()
    means, residuals = [], []
    for mask in (seen, ~seen):
        mean = torch.where(mask, scores, 0.0).sum(0) / mask.sum(0).clamp(min=1)
        means.append(mean.numpy())
        residuals.append(torch.where(mask, scores - mean, 0.0).pow(2).sum())
    sd = max(1e-3, float(((residuals[0] + residuals[1]) / max(1, k * m - 2 * m)).sqrt()))  # one σ, in and out
    t = target.numpy()
    return norm.logpdf(t, means[0], sd) - norm.logpdf(t, means[1], sd)


register(LeakageAttack("lira", "model", lira, LiRAParams,
                       "membership inference calibrated per sample by shadow models that never saw it (offline "
                       "LiRA), or that saw it and did not (online)", "Carlini et al., S&P 2022"))
