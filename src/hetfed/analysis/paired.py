"""Paired comparisons of two methods over the same seeds, and the verdict a reproduction claim gets.

Two methods of one hetfed run share the federation (partition, splits, model
initialisation), so across seeds their scores are *paired*: the spread of the
per-seed difference is much smaller than the spread of either score (a
pathological split moves FedAvg by ±14 points from seed to seed, and every
method with it). Unpaired CIs hide real differences; this module compares the
per-seed differences instead: their mean, its 95% Student-t interval, and the
Wilcoxon signed-rank test (scipy) as a check that does not assume normality.

The verdict rule (issue #28): a claim "A beats B" is *reproduced* only when the
paired 95% CI excludes zero in the claimed direction and at least
:data:`MIN_SEEDS` seeds stand behind it; *opposite* when it excludes zero the
other way; *trend* when the mean difference has the claimed sign but the CI
includes zero; *not reproduced* when the mean has the wrong sign without
excluding zero; *too few seeds* below the minimum. A claim "A matches B" (an
equivalence, :func:`equivalence`) is *reproduced* when the whole paired CI lies
within ±margin, *not reproduced* when the whole CI lies beyond it (a difference
larger than the margin, either way), and *inconclusive* otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: the fewest paired seeds a "reproduced" / "not reproduced" verdict may rest on
MIN_SEEDS = 5

VERDICTS = ("reproduced", "trend", "not reproduced", "opposite", "too few seeds", "inconclusive")


@dataclass(frozen=True)
class Paired:
    """Statistics of the per-seed differences ``a − b``."""

    n: int
    mean: float
    ci_low: float
    ci_high: float
    #: two-sided Wilcoxon signed-rank p-value (exact for small n); NaN when undefined (n < 2, all differences 0)
    wilcoxon_p: float
    #: seeds where a > b, and where a < b
    wins: int
    losses: int
    #: two-sided paired t-test p-value (the test the CI inverts); NaN when undefined
    t_p: float = math.nan

    @property
    def half_width(self) -> float:
        return (self.ci_high - self.ci_low) / 2

    def text(self, scale: float = 1.0, digits: int = 3, direction: int = 1) -> str:
        """``+0.054 [+0.012, +0.096], p = 0.06, 5/5`` (``scale=100`` for points): the Wilcoxon p and the seeds
        where the claimed winner won (a > b; a < b for a claim of ``direction`` −1)."""
        if self.n == 0:
            return "-"
        lo, hi = self.ci_low * scale, self.ci_high * scale
        ci = f" [{lo:+.{digits}f}, {hi:+.{digits}f}]" if self.n > 1 else ""
        p = "" if math.isnan(self.wilcoxon_p) else f", p = {self.wilcoxon_p:.2g}"
        won = self.losses if direction < 0 else self.wins
        return f"{self.mean * scale:+.{digits}f}{ci}{p}, {won}/{self.n} seeds"


def paired_by_seed(a: dict[int, float], b: dict[int, float]) -> Paired:
    """:func:`paired` on two ``{seed: value}`` maps, over the seeds both have (a runs.csv's per-seed values)."""
    common = sorted(set(a) & set(b))
    return paired([a[s] for s in common], [b[s] for s in common])


def paired(a: Sequence[float], b: Sequence[float]) -> Paired:
    """Compare ``a[i]`` with ``b[i]`` (the same seed); pairs with a missing value (None/NaN) are dropped."""
    from scipy import stats

    if len(a) != len(b):
        raise ValueError(f"paired comparison needs one value per seed on both sides: got {len(a)} and {len(b)}")
    x = np.asarray([np.nan if v is None else v for v in a], dtype=float)
    y = np.asarray([np.nan if v is None else v for v in b], dtype=float)
    keep = ~(np.isnan(x) | np.isnan(y))
    d = x[keep] - y[keep]
    n = len(d)
    if n == 0:
        return Paired(0, math.nan, math.nan, math.nan, math.nan, 0, 0)
    mean = float(d.mean())
    if n < 2:
        lo = hi = mean
    else:
        half = float(stats.t.ppf(0.975, n - 1) * d.std(ddof=1) / math.sqrt(n))
        lo, hi = mean - half, mean + half
    p = t_p = math.nan
    if n >= 2 and np.any(d != 0):
        p = float(stats.wilcoxon(d, zero_method="wilcox", alternative="two-sided").pvalue)
        t_p = float(stats.ttest_1samp(d, 0.0).pvalue) if d.std(ddof=1) > 0 else 0.0
    return Paired(n, mean, lo, hi, p, int((d > 0).sum()), int((d < 0).sum()), t_p)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of a family of p-values (same order; NaN stays NaN): controls the chance of
    any false "reproduced" among the family at the level it is read at."""
    order = sorted((p, i) for i, p in enumerate(pvalues) if not math.isnan(p))
    m, out, running = len(order), [math.nan] * len(pvalues), 0.0
    for rank, (p, i) in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def verdict(result: Paired, direction: int = 1, min_seeds: int = MIN_SEEDS) -> str:
    """The claim "a − b has the sign of ``direction``" judged on the paired CI (see the module's rule)."""
    if direction not in (1, -1):
        raise ValueError(f"direction {direction!r} is not allowed: expected 1 (a > b) or -1 (a < b)")
    if result.n < max(min_seeds, 2):
        return "too few seeds"
    lo, hi = result.ci_low * direction, result.ci_high * direction
    lo, hi = min(lo, hi), max(lo, hi)
    if lo > 0:
        return "reproduced"
    if hi < 0:
        return "opposite"
    return "trend" if result.mean * direction > 0 else "not reproduced"


def equivalence(result: Paired, margin: float, min_seeds: int = MIN_SEEDS) -> str:
    """The claim "a matches b within ``margin``" judged on the paired CI (see the module's rule)."""
    if not margin > 0:
        raise ValueError(f"margin {margin!r} is not allowed: expected > 0 (the largest difference that still matches)")
    if result.n < max(min_seeds, 2):
        return "too few seeds"
    if -margin <= result.ci_low and result.ci_high <= margin:
        return "reproduced"
    if result.ci_low > margin or result.ci_high < -margin:
        return "not reproduced"
    return "inconclusive"


def paired_at_chosen(wide: Any, keys: list[str], choice: dict[tuple[str, tuple[Any, ...]], tuple[Any, ...]],
                     method: str, baseline: str) -> list[dict[str, Any]]:
    """``method − baseline``, each at the grid point ``choice`` names for it (:func:`hetfed.runs.sweep_tables.tuned`:
    ``(method, the held keys' cells) → its point``), paired by seed within each value of the held keys — whose seeds
    share their federation whatever the chosen setting — from ``wide`` (a sweep's values indexed by ``keys`` and
    seed, a column a method); the seeds both finished. One row a task: the held cells, both points and
    :func:`paired`'s numbers."""
    from hetfed.runs.sweep_tables import task_keys

    held = task_keys(keys)
    rows = []
    for group in dict.fromkeys(g for m, g in choice if m == method):
        if (baseline, group) not in choice:
            continue
        points = choice[(method, group)], choice[(baseline, group)]
        a, b = (wide.xs(point, level=keys)[name].dropna() for point, name in zip(points, (method, baseline),
                                                                                 strict=True))
        r = paired_by_seed(a.to_dict(), b.to_dict())
        rows.append({**dict(zip(held, group, strict=True)), "method_point": dict(zip(keys, points[0], strict=True)),
                     "baseline_point": dict(zip(keys, points[1], strict=True)), "n": r.n, "mean": r.mean,
                     "ci_low": r.ci_low, "ci_high": r.ci_high, "wilcoxon_p": r.wilcoxon_p, "wins": r.wins})
    return rows
