"""The reproduction table: every claim of the papers hetfed implements, judged from the results folders.

``results/claims.yaml`` lists the claims — the paper's number, where hetfed's
number comes from (a results folder's ``runs.csv``, a method, a metric, the grid
point), and for a comparison the baseline and the claimed direction. This module
turns them into ``results/FIDELITY.md``; nothing in that table is typed by hand.

Kinds of claim:

- ``paired``: "method A beats B" — the per-seed difference on the same federations
  (:func:`hetfed.analysis.paired.paired`) and its verdict (reproduced only when the
  paired 95% CI excludes zero in the paper's direction with ≥ 5 seeds; "in sign, not
  in size" when the paper's own difference, if recorded, lies outside that CI);
  ``direction: 0`` with a ``margin`` is "A matches B": reproduced when the whole
  paired CI lies within ±margin (:func:`hetfed.analysis.paired.equivalence`).
  Two guards keep the CI rule from calling a meaningless difference reproduced:
  a claim that names its metric's ``chance`` level (0.1 for a balanced 10-class
  test set) is *at chance* when both models' means lie within
  :data:`CHANCE_MARGIN` of it — neither learned, so their order says nothing;
  and a difference whose CI excludes zero but whose mean is below the claim's
  ``negligible`` (default :data:`NEGLIGIBLE`) is *reproduced in sign, negligible
  in size* — five seeds of near-identical models make a +0.001 "significant";
- ``value``: one of the paper's numbers — hetfed's mean ± 95% CI next to it;
  *reproduced* when the paper's number lies within the CI widened by the claim's
  ``tolerance`` (default 0.01), *not reproduced* otherwise (the gap is shown);
- ``not_run``: a claim hetfed cannot test here, with the reason (e.g. CIFAR-10 and
  FSD cannot be downloaded offline).

Both round-selection rules are shown where a run keeps both (``best.*``: the
model chosen by validation loss; ``final.*``: the last round's); the verdict uses
the claim's ``select`` (default ``best``) and names the other rule's verdict when
it differs.
"""

from __future__ import annotations

import csv
import functools
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from hetfed.analysis.paired import MIN_SEEDS, Paired, equivalence, holm, paired, verdict
from hetfed.errors import ConfigError
from hetfed.runs.rundir import RUNS_TABLE

KINDS = ("paired", "value", "not_run")
SELECTS = ("best", "final")
#: how far above a claim's ``chance`` both models may lie and still count as not having learned (accuracy)
CHANCE_MARGIN = 0.05
#: the smallest mean difference that counts as a size, not only a sign (half a point of accuracy)
NEGLIGIBLE = 0.005
#: the family-wise level of the papers' directional comparisons, after Holm's correction
FAMILY_ALPHA = 0.05
#: the verdict of a claim whose CI has the right sign but excludes the paper's own difference
OUTSIDE = "not reproduced: the paper's difference lies outside the CI"
#: the verdict of a claim whose CI excludes zero but not after Holm's correction over the family
NOT_AFTER_HOLM = "trend: not significant after Holm's correction"
#: the verdict of a claim whose CI excludes zero against the paper, but not after Holm's correction
NOT_OPPOSITE_AFTER_HOLM = "not reproduced: against the paper, not significant after Holm's correction"


@dataclass(frozen=True)
class Judged:
    """One row of the table."""

    claim: dict
    hetfed: str
    statistic: str
    seeds: str
    verdict: str
    #: the paired statistics under each round-selection rule (paired claims)
    stats: dict[str, Paired] = field(default_factory=dict)

    @property
    def own(self) -> bool:
        """hetfed's own comparison, not a claim the paper makes (shown apart, never counted)."""
        return bool(self.claim.get("own"))


def load_runs(folder: Path) -> list[dict]:
    """A results folder's runs.csv as rows (grid keys as strings, ``seed``, ``method``, ``metric``, ``value``)."""
    path = folder / RUNS_TABLE
    if not path.is_file():
        raise ConfigError(f"claims: {path} is missing — copy the sweep's runs.csv into the results folder")
    stat = path.stat()
    return _read_runs(str(path), stat.st_mtime_ns, stat.st_size)  # many claims read the same folder


@functools.lru_cache(maxsize=64)
def _read_runs(path: str, _mtime_ns: int, _size: int) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _matches(row: dict, point: dict[str, Any]) -> bool:
    for key, want in point.items():
        if key not in row:
            raise ConfigError(f"claims: point key {key!r} is not a grid key of this results folder: "
                              f"expected one of {[k for k in row if k not in ('seed', 'method', 'metric', 'value')]}")
        if not _same(row[key], want):
            return False
    return True


def _same(cell: str, want: Any) -> bool:
    """A runs.csv cell (text) against a YAML value: numbers compare as numbers."""
    try:
        return math.isclose(float(cell), float(want))
    except (TypeError, ValueError):
        return str(cell) == str(want)


def per_seed(rows: list[dict], method: str, metric: str, point: dict[str, Any]) -> dict[int, float]:
    """{seed: value} of one method's metric at one grid point."""
    out = {int(r["seed"]): float(r["value"]) for r in rows
           if r["method"] == method and r["metric"] == metric and _matches(r, point)}
    return out


def _mean_ci(values: list[float]) -> tuple[float, float]:
    from hetfed.engine.summary import ci95_over

    half = ci95_over(values) if len(values) > 1 else math.nan
    return float(np.mean(values)), half


def _fmt(mean: float, half: float, n: int) -> str:
    return f"{mean:.3f}" + ("" if math.isnan(half) else f" ± {half:.3f}") + f" (n={n})"


def _side(results: Path, claim: dict, side: dict, select: str) -> dict[int, float]:
    folder = results / (side.get("folder") or claim["folder"])
    metric = side.get("metric") or claim["metric"]
    if not claim.get("plain"):  # a model's metric, kept per round-selection rule (a plain one: the data's, e.g. Γ)
        metric = f"{select}.{metric}"
    point = {**claim.get("point", {}), **side.get("point", {})}
    values = per_seed(load_runs(folder), side["method"], metric, point)
    if not values:
        raise ConfigError(f"claims: {claim['id']}: no {metric!r} of method {side['method']!r} at "
                          f"{point or 'the only point'} "
                          f"in {folder / 'runs.csv'}")
    return values


def _combined(verdicts: dict[str, str], select: str) -> str:
    """The verdict under the claim's round-selection rule, naming the other rule's when it differs."""
    main = verdicts[select]
    for other, value in verdicts.items():
        if other != select and value != main:
            main += f" (last round: {value})" if other == "final" else f" (best round: {value})"
    return main


def _number(claim: dict, key: str, default: float | None, low: float, high: float) -> float | None:
    """The claim's ``key`` as a float in [low, high), or a one-line error naming the claim, key and value."""
    value = claim.get(key, default)
    if value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not low <= number < high:
        raise ConfigError(f"claims: {claim['id']}: {key} {value!r} is not allowed: expected a number in [{low:g}, "
                          f"{high:g})")
    return number


def _guarded(verdict_: str, r: Paired, means: tuple[float, float], chance: float | None, negligible: float) -> str:
    """The CI verdict, unless both models sit at chance or the difference is too small to be a size."""
    if chance is not None and max(means) <= chance + CHANCE_MARGIN:
        return f"at chance: both models within {CHANCE_MARGIN:g} of {chance:g}, so their order says nothing"
    if verdict_ == "reproduced" and abs(r.mean) < negligible:
        return "reproduced in sign, negligible in size"
    return verdict_


def _judge_paired(results: Path, claim: dict) -> Judged:
    direction = int(claim.get("direction", 1))
    chance = _number(claim, "chance", None, 0.0, 1.0)
    negligible = _number(claim, "negligible", NEGLIGIBLE, 0.0, math.inf)
    shown, verdicts, stats, seeds = [], {}, {}, ""
    for select in ("best",) if claim.get("plain") else SELECTS:
        try:
            a = _side(results, claim, claim["a"], select)
            b = _side(results, claim, claim["b"], select)
        except ConfigError:
            if select == claim.get("select", "best"):
                raise
            continue
        common = sorted(set(a) & set(b))
        r: Paired = paired([a[s] for s in common], [b[s] for s in common])
        least = claim.get("min_seeds", MIN_SEEDS)
        if direction == 0:
            verdicts[select] = equivalence(r, float(claim.get("margin", 0.01)), least)
        else:
            verdicts[select] = verdict(r, direction, least)
        stats[select] = r
        size = claim.get("paper_value")
        # a size is the claim of a direction; a "matches" claim is about a margin, which the paper's own value meets
        outside = size is not None and not r.ci_low <= float(size) <= r.ci_high
        if direction and verdicts[select] == "reproduced" and outside:
            verdicts[select] = "reproduced in sign, not in size"  # the paper's difference lies outside the CI
        if direction and verdicts[select] == "trend" and outside:
            verdicts[select] = OUTSIDE  # a CI that excludes the paper's difference is no trend towards it
        ma, ha = _mean_ci([a[s] for s in common])
        mb, hb = _mean_ci([b[s] for s in common])
        # a "matches" claim is about a small difference, so only the chance guard applies to it
        verdicts[select] = _guarded(verdicts[select], r, (ma, mb), chance,
                                    (negligible or 0.0) if direction else 0.0)
        label = "" if claim.get("plain") else f"{select}: "
        shown.append(f"{label}{claim['a']['method']} {_fmt(ma, ha, len(common))} vs "
                     f"{claim['b']['method']} {_fmt(mb, hb, len(common))}")
        seeds = str(len(common))
    main = _combined(verdicts, claim.get("select", "best"))
    statistic = "; ".join(("Δ = " if claim.get("plain") else f"{s}: Δ = ") + stats[s].text(direction=direction or 1)
                          for s in verdicts)
    return Judged(claim, "<br>".join(shown), statistic, seeds, main, stats)


def _judge_value(results: Path, claim: dict) -> Judged:
    tolerance = float(claim.get("tolerance", 0.01))
    target = None if claim.get("paper_value") is None else float(claim["paper_value"])
    shown, verdicts, seeds = [], {}, ""
    for select in SELECTS:
        try:
            values = list(_side(results, claim, claim, select).values())
        except ConfigError:
            if select == claim.get("select", "best"):
                raise
            continue
        mean, half = _mean_ci(values)
        seeds = str(len(values))
        if target is None:  # hetfed's number beside a paper number nobody could record here, or none exists
            shown.append(f"{select}: {_fmt(mean, half, len(values))}")
            verdicts[select] = ("not judged: the paper gives no number" if claim.get("paper_none") else
                                "not judged: the paper's number is not recorded here")
            continue
        gap = mean - target
        shown.append(f"{select}: {_fmt(mean, half, len(values))}, {gap:+.3f} from the paper")
        reach = (0 if math.isnan(half) else half) + tolerance
        if len(values) < claim.get("min_seeds", MIN_SEEDS):
            verdicts[select] = "too few seeds"
        else:
            verdicts[select] = "reproduced" if abs(gap) <= reach else "not reproduced"
    main = _combined(verdicts, claim.get("select", "best"))
    rule = "-" if target is None else f"paper's value within hetfed's CI + {tolerance:g}"
    return Judged(claim, "<br>".join(shown), rule, seeds, main)


def judge(results: Path, claim: dict) -> Judged:
    """One claim's row."""
    kind = claim.get("kind")
    if kind not in KINDS:
        raise ConfigError(f"claims: {claim.get('id')!r}: kind {kind!r} is not allowed: expected one of {list(KINDS)}")
    if claim.get("select", "best") not in SELECTS:
        raise ConfigError(f"claims: {claim['id']}: select {claim['select']!r} is not allowed: expected one of "
                          f"{list(SELECTS)}")
    if kind == "not_run":
        return Judged(claim, "-", "-", "0", f"not run: {claim['why']}")
    return _judge_paired(results, claim) if kind == "paired" else _judge_value(results, claim)


def load_claims(path: Path) -> list[dict]:
    try:
        claims = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        raise ConfigError(f"claims: {path} is not valid YAML{where}: {getattr(err, 'problem', err)}; "
                          "expected a mapping with a list under 'claims' (quote text that holds ': ')") from None
    items = claims.get("claims", [])
    ids = [c.get("id") for c in items]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ConfigError(f"claims: ids {dupes} appear more than once: every claim needs its own id")
    return items


def render(results: Path, claims_path: Path) -> str:
    """FIDELITY.md's text from the claims and the results folders they name."""
    claims = load_claims(claims_path)
    lines = [
        "# What hetfed reproduces",
        "",
        f"Generated by `python results/fidelity.py` from `{claims_path.name}` and the `runs.csv` of the results",
        "folders it names — do not edit by hand. **Verdicts**: *reproduced* — for a comparison, the paired 95% CI",
        f"of the per-seed difference (same federations) excludes zero in the paper's direction, over ≥ {MIN_SEEDS} "
        "seeds;",
        "for a single number, the paper's value lies within hetfed's 95% CI widened by the claim's tolerance;",
        "*reproduced in sign, not in size* — the CI excludes zero in the paper's direction but does not contain",
        "the paper's own difference; *trend* — the right sign, CI includes zero; *not reproduced* — the wrong sign",
        "(comparison) or outside the",
        "CI (number); *opposite* — the CI excludes zero against the paper; *too few seeds*; *not run* (and why);",
        "*not judged* — hetfed's number where the paper gives none (the *paper* column says why) or it could not be",
        "recorded. A claim that A *matches* B",
        "is reproduced when the whole paired CI lies within ±its margin, not reproduced when it lies wholly",
        "beyond it, *inconclusive* otherwise (the paper's own difference is shown, not required inside the CI). *At "
        "chance* — the claim names its metric's chance level and both",
        f"models lie within {CHANCE_MARGIN:g} of it, so their order says nothing; *reproduced in sign, negligible in "
        "size*",
        f"— the CI excludes zero but the mean difference is below {NEGLIGIBLE:g} (or the claim's own `negligible`).",
        "Numbers are accuracies in [0, 1] unless a claim says otherwise; `best` = the model chosen by validation",
        "loss, `final` = the last round's; Δ = mean paired difference [95% CI], Wilcoxon signed-rank p (two-sided;",
        "with 5 seeds it cannot go below 0.0625), seeds where the claimed winner won.",
        "",
    ]
    judged = _holm([judge(results, claim) for claim in claims])
    family = sum(1 for j in judged if _in_family(j))
    lines.insert(len(lines) - 1, f"Family: the papers' {family} directional comparisons (hetfed's own comparisons "
                 "excluded); a comparison is *reproduced* only when its paired t-test p, Holm-adjusted over the "
                 "family, "
                 f"is below {FAMILY_ALPHA:g} ({NOT_AFTER_HOLM!r} otherwise), and *opposite* likewise "
                 f"({NOT_OPPOSITE_AFTER_HOLM!r} otherwise). *{OUTSIDE}* — the right sign, but the CI "
                 "excludes the paper's own difference (no trend towards it). *deviations*: what the protocol changes. "
                 "Seeds: 5 per protocol (the papers: 4–12 runs); none of these protocols runs in under a minute on "
                 "this project's 2-core CPU (Fed-FSNet ~2 min a run, CGAU ~5, FedMoE ~22), so none has 10.")
    papers: dict[str, list[Judged]] = {}
    for j in judged:
        papers.setdefault(j.claim["paper"], []).append(j)
    head = ["| claim | where | dataset | protocol | deviations | paper | hetfed | paired statistic | seeds | verdict |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    for paper, rows in papers.items():
        lines += [f"## {paper}", "", *head]
        lines += [_row(j) for j in rows if not j.own]
        notes = [f"- `{j.claim['id']}`: {j.claim['note'].strip()}" for j in rows if j.claim.get("note") and not j.own]
        lines += ["", *notes, ""] if notes else [""]
        own = [j for j in rows if j.own]
        if own:
            lines += [f"### hetfed's own comparisons beside {paper.split(' (')[0]} (not claims of the paper; not "
                      "counted)",
                      "", *head, *(_row(j) for j in own), ""]
            lines += [f"- `{j.claim['id']}`: {j.claim['note'].strip()}" for j in own if j.claim.get("note")]
            lines += [""]
    counts: dict[str, int] = {}
    for j in judged:
        if not j.own:
            verdict_head = _head(j.verdict)
            counts[verdict_head] = counts.get(verdict_head, 0) + 1
    lines += ["## Count (the papers' claims)", "", ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())), ""]
    return "\n".join(lines)


def _head(verdict_: str) -> str:
    """A verdict without its parenthesis (the other rule's verdict) or its reason (``not run: …``)."""
    main = verdict_.split(" (")[0]
    return main if main in (OUTSIDE, NOT_AFTER_HOLM, NOT_OPPOSITE_AFTER_HOLM) else main.split(":")[0]


def _row(j: Judged) -> str:
    c = j.claim
    value = c.get("paper_value")
    if value is None:
        shown = "-" if c["kind"] == "not_run" else f"none: {c['paper_none']}" if c.get("paper_none") else "not recorded"
    else:
        shown = f"{value:+.3f}" if c["kind"] == "paired" else f"{value:.3f}"
    return (f"| {c['claim']} | {c['where']} | {c['dataset']} | {c['protocol']} | {c.get('deviations', '-')} | {shown} "
            f"| {j.hetfed} | {j.statistic} | {j.seeds} | **{j.verdict}** |")


def _in_family(j: Judged) -> bool:
    """A directional comparison the paper makes, with a t-test under its round-selection rule."""
    stats = j.stats.get(j.claim.get("select", "best"))
    return (not j.own and j.claim["kind"] == "paired" and int(j.claim.get("direction", 1)) != 0
            and stats is not None and not math.isnan(stats.t_p))


def _holm(judged: list[Judged]) -> list[Judged]:
    """Each directional comparison's t-test p Holm-adjusted over the family (:func:`_in_family`) in its statistic;
    a "reproduced" whose adjusted p is not below :data:`FAMILY_ALPHA` becomes :data:`NOT_AFTER_HOLM`."""
    members = [i for i, j in enumerate(judged) if _in_family(j)]
    raw = [judged[i].stats[judged[i].claim.get("select", "best")].t_p for i in members]
    out = list(judged)
    for i, p, adjusted in zip(members, raw, holm(raw), strict=True):
        j = judged[i]
        verdict_ = j.verdict
        rest = verdict_[verdict_.index(" ("):] if " (" in verdict_ else ""
        if verdict_.startswith("reproduced") and adjusted >= FAMILY_ALPHA:
            verdict_ = NOT_AFTER_HOLM + rest
        elif verdict_.startswith("opposite") and adjusted >= FAMILY_ALPHA:  # significant against the paper only
            verdict_ = NOT_OPPOSITE_AFTER_HOLM + rest  # after the same correction
        out[i] = replace(j, statistic=f"{j.statistic}; t-test p = {p:.2g}, Holm p = {adjusted:.2g}", verdict=verdict_)
    return out
