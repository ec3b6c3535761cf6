"""``fang_krum``: Fang et al.'s full-knowledge Krum attack ("Local model poisoning attacks to Byzantine-robust federated
learning", USENIX Security 2020, §4.2) — made against Krum, and one of the attacks FLTrust (Cao et al., NDSS 2021) is
evaluated under. The malicious clients send Δ' = −λ·s, s the direction in which the honest updates would move each
coordinate (the sign of their sum), with λ as large as Krum still chooses it: from the paper's bound

    λ_max = 1 / ((m − 2c − 1)·√d) · min_i Σ_{l among i's m − c − 2 nearest honest} ‖Δ_l − Δ_i‖
            + 1 / √d · max_i ‖Δ_i‖          (i over the honest updates; m clients, c of them malicious, d parameters)

λ is halved until Krum (Blanchard et al.'s score, f = c, over the honest updates and c copies of Δ') chooses a copy;
below ``stop`` the search gives up and the malicious clients send 0 (λ = 0: the round's model). The first malicious
client sends Δ' itself, the others Δ' plus noise drawn uniformly from ±e, e = ``noise`` / d, so that Krum's copies are
near but not equal.

As the attack's code released with Fang's and FLTrust's experiments (``full_krum``, ``lambda_max``, ``find_lambda``:
the same bound, halving, 1e-5 stop and 1e-5/d noise), written here on updates Δ = θ_k − θ rather than gradients — the
same under Δ = −lr·g, the distances scaled by lr. Departures, where hetfed's model of the attack differs: the bound's
sums and the direction are over the round's honest updates (the code's include the malicious clients' own benign
ones, which hetfed's malicious clients do not report); the search asks hetfed's own Krum (squared distances, as the
paper and the ``krum`` rule; the code's check sums plain distances); when it gives up, the code leaves the malicious
clients' benign updates, here they send 0.

Under ``knowledge: partial`` (the paper's partial knowledge: the compromised clients' models before the attack stand in
for the benign ones) the direction, the bound's sums and Krum's check take the malicious clients' own updates, as they
trained them, in the honest updates' place (the bound's m and c are still the round's): the check is among those c and
c copies, which Krum always lets a copy win (its score sums distances to the c − 2 nearest, the other copies), so λ is
the bound itself. With fewer than two malicious clients in a round they send 0."""

from __future__ import annotations

import math

import torch
from pydantic import Field

from hetfed.engine.attacks import ClientAttack, ColludingParams, Honest, register
from hetfed.engine.centrality import krum_scores


class FangKrumParams(ColludingParams):
    stop: float = Field(1e-5, gt=0, description="λ below which the search gives up (the code's 1e-5)")
    noise: float = Field(1e-5, ge=0, description="the other malicious clients' noise: uniform on ±noise/d around "
                                                 "the first's update (the code's 1e-5)")


def lambda_bound(rows: torch.Tensor, c: int, m: int) -> float:
    """The paper's upper bound on λ from the benign updates ``rows`` ``[h, d]`` the attack knows, for ``m`` clients of
    which ``c`` are malicious."""
    h, d = rows.shape
    dist = torch.cdist(rows, rows)
    nearest = max(min(m - c - 2, h - 1), 0)  # each update's nearest others among the known ones
    spread = dist.sort(dim=1).values[:, 1: 1 + nearest].sum(1).min().item() if nearest else 0.0
    return float(spread / (max(m - 2 * c - 1, 1) * math.sqrt(d)) + rows.norm(dim=1).max().item() / math.sqrt(d))


def krum_chooses(rows: torch.Tensor, crafted: torch.Tensor, c: int) -> bool:
    """Whether Krum (f = c) over the honest ``rows`` and ``c`` copies of ``crafted`` chooses a copy."""
    points = torch.cat([crafted.expand(c, -1), rows])
    return int(krum_scores(points, c).argsort(stable=True)[0]) < c


def crafted_lambda(rows: torch.Tensor, direction: torch.Tensor, c: int, m: int, stop: float) -> float:
    """λ: the bound, halved until Krum chooses −λ·s (0 when it falls below ``stop`` first)."""
    lam = lambda_bound(rows, c, m)
    while lam > stop:
        if krum_chooses(rows, -lam * direction, c):
            return lam
        lam /= 2
    return 0.0


def fang_krum(honest: Honest, p: FangKrumParams) -> dict[str, torch.Tensor]:
    assert honest.rows is not None and honest.uniform is not None
    names = list(honest.rows)
    rows = torch.cat([honest.rows[k].reshape(len(honest.rows[k]), -1) for k in names], dim=1)  # [h, d] float64
    h, d = rows.shape
    direction = torch.sign(rows.sum(0))
    lam = crafted_lambda(rows, direction, honest.m, honest.n, p.stop) if h >= 2 else 0.0
    out, at = {}, 0
    for k in names:
        shape = honest.rows[k].shape[1:]
        size = math.prod(shape)
        base = (-lam * direction[at: at + size]).reshape(shape)
        at += size
        jitter = (2 * honest.uniform(k) - 1) * (p.noise / d)  # [m, …]: each malicious client's own
        jitter[0] = 0  # the first sends Δ' itself
        out[k] = base + jitter
    return out


register(ClientAttack("fang_krum", "colluding model poisoning: every malicious client sends −λ·(the honest updates' "
                      "direction), λ the largest Krum still chooses (Fang et al.'s Krum attack)",
                      FangKrumParams, collude=fang_krum, reads_rows=True))
