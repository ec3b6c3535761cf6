"""Combine rules: how a round's screened updates become one model (the chain's second step).

Each rule is one file in this package that calls :func:`register` with a :class:`CombineRule`: its
name (``server.combine.rule``), the function, its own parameters as a pydantic model (validated
where the config is, ``server.combine.<key>``), and whether it *streams* — consumes running sums,
so a round's memory stays flat (the mean) — or needs every update of the round at once (the
robust rules); a rule may remember what it combined the round before (centered clipping's centre) and may draw
random numbers (FLAME's noise), from the run seed and the round. A rule that decides how much each update counts
returns its parameters as :class:`Weighed` (each update's weight beside them: what the defence decided, in
metrics.csv under an attack). Rules are found by importing this package's modules; nothing lists them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

from hetfed.config_server import CombineConfig
from hetfed.engine.types import Params
from hetfed.registry import Registry


class RuleParams(BaseModel):
    """A rule's own parameters (none by default); unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class Weighed(dict[str, torch.Tensor]):
    """A rule's combined parameters (a ``Params`` dict, read as any other) with ``weights``: each update's weight in
    them as the rule weighs it, one per row of the round's upload — ≥ 0, 0 for an update it left out (Krum's, DnC's,
    FLAME's, FLTrust's zero trust). Returned by the rules that decide per update, and by the coordinate-wise median
    and trimmed mean as each update's share of the values they kept (:meth:`kept_values`); the robust learning rate
    and centered clipping weigh no update and return plain parameters. Why: which updates a defence kept, and the
    share of its weight the malicious ones got, is what a study of defences reads (:mod:`hetfed.server.detection`)."""

    def __init__(self, value: Params, weights: torch.Tensor) -> None:
        super().__init__(value)
        self.weights = weights

    @classmethod
    def averaging(cls, value: Params, kept: torch.Tensor | list[int], n: int) -> Weighed:
        """``value`` of a rule that averaged the rows ``kept`` of a round's ``n`` updates: 1/|kept| each, 0 for the
        others."""
        weights = torch.zeros(n, dtype=torch.float64)
        if len(kept):
            weights[torch.as_tensor(kept).cpu()] = 1.0 / len(kept)
        return cls(value, weights)

    @classmethod
    def kept_values(cls, stacked: Params, kept: slice) -> Weighed:
        """A coordinate-wise rule's combination: in every coordinate, the mean of the values in the places ``kept`` of
        the round's updates sorted (``stacked``: per parameter, the updates' values ``[n, …]``). An update's weight is
        its share of all the values kept — the mean over coordinates of its weight there —, 0 for an update cut in
        every coordinate. Equal values share the places they fill: in a coordinate no client moved every update weighs
        alike."""
        ordered = {k: v.sort(0) for k, v in stacked.items()}
        first = next(iter(stacked.values()))
        counts = sum((_kept_places(o.values, o.indices, kept) for o in ordered.values()),
                     torch.zeros(len(first), dtype=torch.float64, device=first.device))
        return cls({k: o.values[kept].mean(0) for k, o in ordered.items()},
                   (counts / counts.sum().clamp(min=1e-300)).cpu())


def _kept_places(values: torch.Tensor, rows: torch.Tensor, kept: slice) -> torch.Tensor:
    """Each row's count of the places ``kept`` of one parameter's sorted ``values`` ``[n, …]`` (``rows``: whose
    value is in each place), a run of equal values sharing its places kept equally among its rows."""
    n = len(values)
    v, r = values.reshape(n, -1), rows.reshape(n, -1)
    starts = torch.ones_like(v, dtype=torch.bool)
    starts[1:] = v[1:] != v[:-1]
    run = (starts.cumsum(0) - 1) * v.shape[1] + torch.arange(v.shape[1], device=v.device)  # a run's id, per column
    in_kept = torch.zeros_like(v, dtype=torch.float64)
    in_kept[kept] = 1.0
    size = torch.bincount(run.reshape(-1), minlength=v.numel()).double()
    share = torch.bincount(run.reshape(-1), weights=in_kept.reshape(-1), minlength=v.numel()) / size.clamp(min=1)
    return torch.zeros(n, dtype=torch.float64, device=v.device).index_add_(0, r.reshape(-1), share[run].reshape(-1))


@dataclass(frozen=True)
class CombineRule:
    """One registered rule. ``combine(reference, upload, params)`` → the combined shared parameters; a rule that
    ``remembers`` what it combined before takes and returns its state too: ``combine(reference, upload, params,
    state)`` → (parameters, state), the state plain data the server's checkpoints keep ({} before its first round); a
    rule that ``draws`` is given a generator of its own (``rng=``, a CPU ``torch.Generator`` from the run seed and the
    round: the same draws on every device and executor); a rule that ``reads_clients`` tells clients apart by their
    ids (FoolsGold's histories), which bucketing would replace by buckets'; a rule that trains on a ``root`` set is
    given the server's own model trained from the round's reference on its labelled root set (``root=``, shared
    parameters: FLTrust's server update; the server then keeps its holdout's labels)."""

    name: str
    combine: Callable[..., Params | tuple[Params, dict[str, Any]]]
    Params: type[RuleParams]
    streams: bool
    summary: str
    paper: str = ""
    remembers: bool = False
    draws: bool = False
    reads_clients: bool = False
    root: bool = False
    #: the rule for several runs at once (a stacked sweep's runs of one chain): ``combine_runs(references, uploads,
    #: params)`` → each run's value as ``combine`` gives it alone, in one call; None: run by run
    combine_runs: Callable[..., Sequence[dict[str, torch.Tensor]]] | None = None


def _described(rule: CombineRule) -> dict[str, Any]:
    from hetfed.registry import describe_params

    return {"summary": rule.summary, "paper": rule.paper, "streams": rule.streams, "remembers": rule.remembers,
            "draws": rule.draws, "reads_clients": rule.reads_clients, "root": rule.root,
            "params": describe_params(rule.Params)}


RULES: Registry[CombineRule] = Registry("combine", __name__, "server.combine.rule", describe=_described,
                                        noun="combine rule")


def register(rule: CombineRule) -> CombineRule:
    return RULES.register(rule.name, rule)


def names() -> list[str]:
    return RULES.names()


def get(name: str, where: str = "server.combine.rule") -> CombineRule:
    return RULES.get(name, where)


def parse(section: CombineConfig | dict[str, Any]) -> tuple[CombineRule, RuleParams]:
    """``server.combine`` (or a plain ``{"rule": name, **its params}``) → the rule and its validated parameters."""
    chosen = section if isinstance(section, CombineConfig) else CombineConfig.model_validate(section)
    return RULES.get(chosen.rule), chosen.params
