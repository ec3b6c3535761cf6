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
clients' own before they attack included (hetfed's malicious clients do not report theirs).

Under ``knowledge: partial`` (the paper's partial knowledge) the malicious clients know only their own updates as they
trained them: from those, each coordinate's mean μ_j, standard deviation σ_j (c in the denominator, as the code's
``partial_trim``) and direction s_j = sign(μ_j); each malicious client sends μ_j − r·σ_j·s_j, r drawn uniformly from
[3, 4] for each client and coordinate (the paper's interval; the code sends its midpoint, 3.5). ``b`` is not read
there, and is refused."""

from __future__ import annotations

import torch
from pydantic import Field, model_validator

from hetfed.engine.attacks import ClientAttack, ColludingParams, Honest, register

#: under partial knowledge, how many of their own updates' standard deviations the malicious clients go past their mean
PARTIAL_REACH = (3.0, 4.0)


class FangTrimParams(ColludingParams):
    b: float = Field(2.0, gt=1, description="r's range [1, b]: how far past the honest extreme (the paper's 2; "
                                            "knowledge: full only)")

    @model_validator(mode="after")
    def _b_read(self) -> FangTrimParams:
        # away from its default, as hetfed judges a key the user set (a sweep's run sees every key written out)
        if self.knowledge == "partial" and self.b != type(self).model_fields["b"].default:
            raise ValueError(f"attack.b = {self.b} is not read under attack.knowledge = 'partial' (the malicious "
                             f"clients go {PARTIAL_REACH[0]:g}–{PARTIAL_REACH[1]:g} of their own updates' standard "
                             "deviations past their mean): drop it, or use knowledge: full")
        return self


def fang_trim(honest: Honest, p: FangTrimParams) -> dict[str, torch.Tensor]:
    assert honest.rows is not None and honest.uniform is not None
    out = {}
    for name, rows in honest.rows.items():
        if p.knowledge == "partial":
            low, high = PARTIAL_REACH
            mean = rows.mean(0)
            out[name] = mean - (low + (high - low) * honest.uniform(name)) * rows.std(0, correction=0) * mean.sign()
            continue
        direction = torch.sign(rows.sum(0))
        directed = (direction > 0) * rows.min(0).values + (direction < 0) * rows.max(0).values
        r = 1 + (p.b - 1) * honest.uniform(name)  # [m, …]: each malicious client's own
        along = direction * directed
        out[name] = directed * ((along > 0) / r + (along < 0) * r)
    return out


register(ClientAttack("fang_trim", "colluding model poisoning: every coordinate pushed against the honest updates' "
                      "direction, past their extreme by a random factor in [1, b] (Fang et al.'s Trim attack; under "
                      "partial knowledge 3–4 of their own updates' standard deviations past their mean)",
                      FangTrimParams, collude=fang_trim, reads_rows=True))
