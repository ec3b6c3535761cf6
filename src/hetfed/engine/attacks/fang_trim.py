"""``fang_trim``: Fang et al.'s full-knowledge Trim attack ("Local model poisoning attacks to Byzantine-robust
federated learning", USENIX Security 2020, §4) — made against the trimmed mean and the median, and one of the attacks
FLTrust (Cao et al., NDSS 2021) is evaluated under. Each coordinate j is pushed against the direction s_j in which the
honest updates would move it (the sign of their sum), past the honest values' extreme on that side: where s_j > 0,
from their minimum w_min,j to w_min,j / r when it is positive and r·w_min,j when it is negative; where s_j < 0, the
same from their maximum; r drawn uniformly from [1, b] for each malicious client and coordinate (b = 2, the paper's).

As the attack's code released with FLTrust's and Fang's experiments (``full_trim``: the directed extreme
``(s > 0)·min + (s < 0)·max``, divided by r where it has the sign of s, multiplied by r where it has the other),
written here on updates Δ = θ_k − θ rather than gradients — the formula is the same under Δ = −lr·g (a sign flip of
every input flips the output). Omniscient, as there; one departure: the extremes and directions are taken over the
round's honest clients' updates, where the code takes them over every client's benign update, the malicious
clients' own before they attack included (hetfed's malicious clients do not report theirs)."""

from __future__ import annotations

import torch
from pydantic import Field

from hetfed.engine.attacks import ClientAttack, Honest, register
from hetfed.registry import ComponentParams


class FangTrimParams(ComponentParams):
    b: float = Field(2.0, gt=1, description="r's range [1, b]: how far past the honest extreme (the paper's 2)")


def fang_trim(honest: Honest, p: FangTrimParams) -> dict[str, torch.Tensor]:
    assert honest.rows is not None and honest.uniform is not None
    out = {}
    for name, rows in honest.rows.items():
        direction = torch.sign(rows.sum(0))
        directed = (direction > 0) * rows.min(0).values + (direction < 0) * rows.max(0).values
        r = 1 + (p.b - 1) * honest.uniform(name)  # [m, …]: each malicious client's own
        along = direction * directed
        out[name] = directed * ((along > 0) / r + (along < 0) * r)
    return out


register(ClientAttack("fang_trim", "colluding model poisoning: every coordinate pushed against the honest updates' "
                      "direction, past their extreme by a random factor in [1, b] (Fang et al.'s full-knowledge Trim "
                      "attack)", FangTrimParams, collude=fang_trim, reads_rows=True))
