"""Paired statistics, the per-seed runs.csv a sweep writes, and the generated reproduction table (#28)."""

from __future__ import annotations

import csv
import itertools
import json
import math
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.analysis.fidelity import render
from hetfed.analysis.paired import Paired, equivalence, paired, verdict
from hetfed.cli import main
from hetfed.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


# --- paired statistics against computations written from their definitions ---------------------------------

def test_paired_statistics_match_the_textbook_computation():
    a = [0.85, 0.82, 0.86, 0.79, 0.81]
    b = [0.80, 0.80, 0.80, 0.80, 0.77]  # differences +0.05 +0.02 +0.06 −0.01 +0.04
    r = paired(a, b)
    d = [x - y for x, y in zip(a, b, strict=True)]
    mean = sum(d) / 5
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 4)
    t975_4 = 2.7764451051977987  # Student t, 4 degrees of freedom, 97.5th percentile (tables)
    assert r.n == 5 and r.mean == pytest.approx(0.032)
    assert r.ci_low == pytest.approx(mean - t975_4 * sd / math.sqrt(5))
    assert r.ci_high == pytest.approx(mean + t975_4 * sd / math.sqrt(5))
    # exact Wilcoxon signed-rank: |d| ranks 4, 2, 5, 1, 3; the negative side holds rank 1 (W− = 1).
    # Under H0 each sign is a fair coin: P(W− ≤ 1) = #{subsets of {1..5} with rank sum ≤ 1} / 2^5 = 2/32
    subsets = [s for k in range(6) for s in itertools.combinations(range(1, 6), k)]
    tail = sum(1 for s in subsets if sum(s) <= 1) / 2 ** 5
    assert r.wilcoxon_p == pytest.approx(2 * tail)  # two-sided: 0.125
    assert (r.wins, r.losses) == (4, 1)


def test_pairs_with_a_missing_value_are_dropped_and_lengths_must_match():
    r = paired([0.5, None, 0.7, float("nan")], [0.4, 0.3, 0.6, 0.2])
    assert r.n == 2 and r.mean == pytest.approx(0.1)
    with pytest.raises(ValueError, match="one value per seed"):
        paired([0.1, 0.2], [0.1])
    assert math.isnan(paired([0.5, 0.6], [0.5, 0.6]).wilcoxon_p)  # all differences 0: undefined, not 1


@pytest.mark.parametrize(("diffs", "direction", "expected"), [
    ([0.05, 0.04, 0.06, 0.05, 0.03], 1, "reproduced"),
    ([0.05, 0.04, 0.06, 0.05, 0.03], -1, "opposite"),
    ([0.05, -0.04, 0.06, 0.01, -0.03], 1, "trend"),
    ([0.05, -0.04, 0.06, 0.01, -0.03], -1, "not reproduced"),
    ([0.05, 0.04, 0.06, 0.05], 1, "too few seeds"),
])
def test_verdict_rules(diffs, direction, expected):
    r = paired([0.5 + d for d in diffs], [0.5] * len(diffs))
    assert verdict(r, direction) == expected


@pytest.mark.parametrize(("diffs", "expected"), [
    ([0.001, -0.002, 0.000, 0.002, -0.001], "reproduced"),  # CI ≈ ±0.002: within ±0.01
    ([0.05, 0.04, 0.06, 0.05, 0.03], "not reproduced"),  # CI ≈ [0.03, 0.06]: beyond +0.01
    ([-0.05, -0.04, -0.06, -0.05, -0.03], "not reproduced"),  # beyond −0.01: a difference either way
    ([0.02, -0.01, 0.03, 0.00, -0.02], "inconclusive"),  # CI ≈ [−0.02, +0.03] straddles the margin
    ([0.0, 0.0, 0.0, 0.0], "too few seeds"),
])
def test_equivalence_rules(diffs, expected):
    r = paired([0.5 + d for d in diffs], [0.5] * len(diffs))
    assert equivalence(r, 0.01) == expected
    with pytest.raises(ValueError, match="margin"):
        equivalence(r, 0.0)


@settings(max_examples=25, deadline=None)  # 60 took 35 s of a loaded suite worker (7 s alone)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=2, max_size=12))
def test_swapping_the_sides_mirrors_everything(pairs):
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    ab, ba = paired(a, b), paired(b, a)
    assert ab.mean == pytest.approx(-ba.mean, abs=1e-12)
    assert ab.ci_low == pytest.approx(-ba.ci_high, abs=1e-12)
    assert (ab.wins, ab.losses) == (ba.losses, ba.wins)
    assert ab.ci_low <= ab.mean <= ab.ci_high
    assert verdict(ab, 1, min_seeds=2) == verdict(ba, -1, min_seeds=2)
    assert equivalence(ab, 0.05, min_seeds=2) == equivalence(ba, 0.05, min_seeds=2)
    if not math.isnan(ab.wilcoxon_p):
        assert ab.wilcoxon_p == pytest.approx(ba.wilcoxon_p)


# --- runs.csv: every run's own value ------------------------------------------------------------------------

@pytest.mark.slow
def test_a_sweep_writes_every_runs_values_and_pairs_them(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert main(["sweep", str(REPO / "configs" / "default.yaml"), "--set", "train.rounds=2", "--set",
                 "train.eval_every=1",
                 "--grid", "partition.shuffle=0,1", "--seeds", "2", "--out", str(out)]) == 0
    capsys.readouterr()
    with open(out / "runs.csv") as fh:
        rows = list(csv.DictReader(fh))
    record = json.loads((out / "sweep.json").read_text())
    assert len(record["runs"]) == 4
    for run in record["runs"]:
        summary = json.loads((Path(run["run_dir"]) / "summary.json").read_text())
        mine = {(r["method"], r["metric"]): float(r["value"]) for r in rows
                if float(r["partition.shuffle"]) == run["point"]["partition.shuffle"] and int(r["seed"]) == run["seed"]}
        assert mine[("(data)", "gamma")] == summary["gamma"]
        for method, m in summary["methods"].items():
            assert mine[(method, "best.global_accuracy")] == m["best"]["global_accuracy"]
            assert mine[(method, "final.local_accuracy_mean")] == m["final"]["local_accuracy_mean"]
            assert mine[(method, "best_round")] == m["best_round"]
    # curves.csv: each run's round-by-round evaluation; its last round is the run's final model
    with open(out / "curves.csv") as fh:
        curves = list(csv.DictReader(fh))
    for run in record["runs"]:
        summary = json.loads((Path(run["run_dir"]) / "summary.json").read_text())
        for method, m in summary["methods"].items():
            mine = {int(r["round"]): float(r["value"]) for r in curves
                    if r["method"] == method and r["metric"] == "global_accuracy" and int(r["seed"]) == run["seed"]
                    and float(r["partition.shuffle"]) == run["point"]["partition.shuffle"]}
            assert sorted(mine) == [1, 2] and mine[2] == m["final"]["global_accuracy"]
    # the sweep's means are the means of these values
    with open(out / "sweep.csv") as fh:
        means = {(r["partition.shuffle"], r["method"], r["metric"]): float(r["mean"]) for r in csv.DictReader(fh)}
    cgau = [float(r["value"]) for r in rows if r["method"] == "cgau" and r["metric"] == "best.global_accuracy"
            and float(r["partition.shuffle"]) == 0]
    assert means[("0", "cgau", "best.global_accuracy")] == pytest.approx(sum(cgau) / len(cgau))
    # the API pairs the two methods seed by seed
    import hetfed

    table = hetfed.Sweep(str(out)).paired("cgau", "relu", "best.local_accuracy_mean")  # a folder's name as typed
    assert list(table["partition.shuffle"]) == [0.0, 1.0]
    for shuffle, got in zip((0.0, 1.0), table.itertuples(), strict=True):
        def side(method, shuffle=shuffle):
            return [float(r["value"]) for r in sorted(rows, key=lambda r: int(r["seed"]))
                    if r["method"] == method and r["metric"] == "best.local_accuracy_mean"
                    and float(r["partition.shuffle"]) == shuffle]
        ref = paired(side("cgau"), side("relu"))
        assert got.n == 2 and got.mean == pytest.approx(ref.mean) and got.ci_low == pytest.approx(ref.ci_low)
    with pytest.raises(ConfigError, match="method 'fedx' is not in this sweep"):
        hetfed.Sweep(out).paired("fedx", "relu")


# --- the generated reproduction table ------------------------------------------------------------------------

def _write_runs(folder: Path, values: dict[tuple[str, str, int], float], key: str = "train.client_fraction",
                point: float = 0.1) -> None:
    folder.mkdir(parents=True)
    with open(folder / "runs.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([key, "seed", "method", "metric", "value"])
        for (method, metric, seed), value in values.items():
            w.writerow([point, seed, method, metric, value])


def _fixture(tmp_path: Path) -> Path:
    seeds = range(5)
    shards = {}
    for s in seeds:
        for when, shift in (("best", 0.0), ("final", -0.01)):
            shards[("fedavg", f"{when}.global_accuracy", s)] = 0.70 + 0.02 * s + shift
            shards[("fsnet", f"{when}.global_accuracy", s)] = 0.75 + 0.02 * s + shift + (0.001 * s)
            shards[("fedprox", f"{when}.global_accuracy",
                    s)] = 0.70 + 0.02 * s + shift + (0.012 if s % 2 == 0 else -0.01)
    _write_runs(tmp_path / "paper" / "shards", shards)
    _write_runs(tmp_path / "paper" / "iid", {("fedavg", f"{w}.global_accuracy", s): 0.96 + 0.001 * s
                                              for s in seeds for w in ("best", "final")})
    claims = {"claims": [
        {"id": "gain", "paper": "Fed-FSNet", "claim": "Fed-FSNet beats FedAvg", "where": "Table 1", "dataset": "MNIST",
         "protocol": "paper's", "kind": "paired", "folder": "paper/shards", "metric": "global_accuracy",
         "point": {"train.client_fraction": 0.1}, "a": {"method": "fsnet"}, "b": {"method": "fedavg"},
         "paper_value": 0.444, "note": "the gain is 5 points here"},
        {"id": "gain-size", "paper": "Fed-FSNet", "claim": "Fed-FSNet beats FedAvg by about 5 points",
         "where": "Table 1",
         "dataset": "MNIST", "protocol": "paper's", "kind": "paired", "folder": "paper/shards",
         "metric": "global_accuracy",
         "a": {"method": "fsnet"}, "b": {"method": "fedavg"}, "paper_value": 0.051},
        {"id": "prox", "paper": "Fed-FSNet", "claim": "Fed-FSNet is beaten by FedProx", "where": "Table 2",
         "dataset": "MNIST", "protocol": "paper's", "kind": "paired", "folder": "paper/shards",
         "metric": "global_accuracy", "a": {"method": "fedprox"}, "b": {"method": "fsnet"}, "direction": 1},
        {"id": "prox-trend", "paper": "Fed-FSNet", "claim": "FedProx beats FedAvg", "where": "Table 2",
         "dataset": "MNIST", "protocol": "paper's", "kind": "paired", "folder": "paper/shards",
         "metric": "global_accuracy", "a": {"method": "fedprox"}, "b": {"method": "fedavg"}},
        {"id": "prox-matches", "paper": "Fed-FSNet", "claim": "FedProx matches FedAvg within 0.02", "where": "Table 2",
         "dataset": "MNIST", "protocol": "paper's", "kind": "paired", "folder": "paper/shards",
         "metric": "global_accuracy", "a": {"method": "fedprox"}, "b": {"method": "fedavg"}, "direction": 0,
         "margin": 0.02},
        {"id": "fsnet-matches", "paper": "Fed-FSNet", "claim": "Fed-FSNet matches FedAvg", "where": "Table 2",
         "dataset": "MNIST", "protocol": "paper's", "kind": "paired", "folder": "paper/shards",
         "metric": "global_accuracy", "a": {"method": "fsnet"}, "b": {"method": "fedavg"}, "direction": 0},
        {"id": "iid", "paper": "Fed-FSNet", "claim": "IID upper bound", "where": "Table 1", "dataset": "MNIST",
         "protocol": "paper's", "kind": "value", "folder": "paper/iid", "metric": "global_accuracy",
         "method": "fedavg", "paper_value": 0.97},
        {"id": "iid-far", "paper": "Fed-FSNet", "claim": "IID upper bound (other)", "where": "Table 1",
         "dataset": "MNIST", "protocol": "paper's", "kind": "value", "folder": "paper/iid",
         "metric": "global_accuracy", "method": "fedavg", "paper_value": 0.5},
        {"id": "iid-unrecorded", "paper": "Fed-FSNet", "claim": "IID upper bound (number not recorded)",
         "where": "Table 1", "dataset": "MNIST", "protocol": "paper's", "kind": "value", "folder": "paper/iid",
         "metric": "global_accuracy", "method": "fedavg", "paper_value": None},
        {"id": "cifar", "paper": "CGAU", "claim": "CGAU beats ReLU on CIFAR-10", "where": "Table 2",
         "dataset": "CIFAR-10", "protocol": "-", "kind": "not_run", "why": "CIFAR-10 cannot be downloaded here"},
    ]}
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump(claims, sort_keys=False))
    return tmp_path


def _row(text: str, claim: str) -> list[str]:
    """A row's cells without the deviations column (the fifth)."""
    line = next(line for line in text.splitlines() if line.startswith(f"| {claim} |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    return cells[:4] + cells[5:]


def test_fidelity_table_is_generated_from_the_runs(tmp_path):
    root = _fixture(tmp_path)
    text = render(root, root / "claims.yaml")
    gain = _row(text, "Fed-FSNet beats FedAvg")
    # fsnet − fedavg per seed: 0.05 + 0.001 s → mean 0.052, a CI that excludes 0 → reproduced (both rules)
    assert gain[4] == "+0.444" and "+0.052" in gain[6] and gain[7] == "5"
    assert gain[8] == "**reproduced in sign, not in size**"  # the paper's +0.444 lies far outside [+0.050, +0.054]
    assert _row(text, "Fed-FSNet beats FedAvg by about 5 points")[8] == "**reproduced**"
    assert "best: fsnet 0.792" in gain[5] and "final: fsnet 0.782" in gain[5]
    assert _row(text, "Fed-FSNet is beaten by FedProx")[8] == "**opposite**"
    assert _row(text, "FedProx beats FedAvg")[8] == "**trend**"  # +0.012, −0.010 alternating: mean > 0, CI ∋ 0
    # the same differences: mean +0.0032, t-CI ≈ ±0.0152 → [−0.012, +0.018] within ±0.02, not within ±0.01
    assert _row(text, "FedProx matches FedAvg within 0.02")[8] == "**reproduced**"
    assert _row(text, "Fed-FSNet matches FedAvg")[8] == "**not reproduced**"  # +0.052, far beyond ±0.01
    iid = _row(text, "IID upper bound")
    assert iid[8] == "**reproduced**" and "0.962" in iid[5]  # 0.962 ± 0.002: 0.97 lies within the CI widened by 0.01
    assert _row(text, "IID upper bound (other)")[8] == "**not reproduced**"
    unrecorded = _row(text, "IID upper bound (number not recorded)")
    assert unrecorded[4] == "not recorded" and "0.962" in unrecorded[5] and unrecorded[6] == "-"
    assert unrecorded[8] == "**not judged: the paper's number is not recorded here**"
    assert "not run: CIFAR-10 cannot be downloaded here" in _row(text, "CGAU beats ReLU on CIFAR-10")[8]
    assert "- `gain`: the gain is 5 points here" in text
    assert "## Fed-FSNet" in text and "## CGAU" in text


def _judge_pair(tmp_path: Path, a: list[float], b: list[float], **claim) -> str:
    """The verdict the generator gives "a beats b" on five seeds of the given values."""
    values = {("a", f"{w}.global_accuracy", s): a[s] for s in range(5) for w in ("best", "final")}
    values |= {("b", f"{w}.global_accuracy", s): b[s] for s in range(5) for w in ("best", "final")}
    _write_runs(tmp_path / "r", values)
    spec = {"id": "x", "paper": "P", "claim": "a beats b", "where": "-", "dataset": "-", "protocol": "-",
            "kind": "paired", "folder": "r", "metric": "global_accuracy", "a": {"method": "a"}, "b": {"method": "b"}}
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump({"claims": [spec | claim]}))
    return _row(render(tmp_path, tmp_path / "claims.yaml"), "a beats b")[8].strip("*")


def test_two_models_at_chance_are_not_judged(tmp_path):
    # a − b = +0.007 on every seed: the CI excludes zero, but both means (0.120, 0.113) lie within 0.05 of chance 0.1
    a, b = [0.118, 0.119, 0.120, 0.121, 0.122], [0.111, 0.112, 0.113, 0.114, 0.115]
    assert _judge_pair(tmp_path / "1", a, b) == "reproduced"
    assert _judge_pair(tmp_path / "2", a, b, chance=0.1).startswith("at chance: both models within 0.05 of 0.1")
    # the same difference above chance (0.720 vs 0.713) is judged as before
    assert _judge_pair(tmp_path / "3", [v + 0.6 for v in a], [v + 0.6 for v in b], chance=0.1) == "reproduced"
    # one model learned (0.40), the other did not: the comparison says something
    assert _judge_pair(tmp_path / "4", [0.40] * 5, b, chance=0.1) == "reproduced"


def test_a_significant_but_tiny_difference_is_reproduced_in_sign_only(tmp_path):
    # a − b = +0.001, +0.001, +0.002, +0.001, +0.001: CI ≈ [+0.0006, +0.0018] excludes zero, the mean +0.0012 < 0.005
    b = [0.778, 0.770, 0.781, 0.775, 0.779]
    a = [x + d for x, d in zip(b, [0.001, 0.001, 0.002, 0.001, 0.001], strict=True)]
    assert _judge_pair(tmp_path / "1", a, b) == "reproduced in sign, negligible in size"
    assert _judge_pair(tmp_path / "2", a, b, negligible=0.001) == "reproduced"  # a claim may set its own threshold
    assert _judge_pair(tmp_path / "3", a, b, negligible=0) == "reproduced"


def test_a_matches_claim_is_not_judged_on_the_papers_size_and_a_direction_claim_is(tmp_path):
    """#45: FedMoE's "the mixture matches fine-tuning within 1 point" claims now carry the paper's own difference
    (e.g. +0.0068 at p = 0.8); it lies outside hetfed's CI [−0.006, +0.001] but inside the margin the claim is
    about, so the claim stays reproduced; a direction claim's paper size outside the CI is "in sign, not in size"."""
    b = [0.778, 0.770, 0.781, 0.775, 0.779]
    a = [x + d for x, d in zip(b, [-0.003, -0.002, -0.004, -0.003, -0.001], strict=True)]
    assert _judge_pair(tmp_path / "1", a, b, direction=0, margin=0.01, paper_value=0.0068) == "reproduced"
    up = [x + d for x, d in zip(b, [0.05, 0.04, 0.06, 0.05, 0.05], strict=True)]
    assert _judge_pair(tmp_path / "2", up, b, paper_value=0.30) == "reproduced in sign, not in size"
    assert _judge_pair(tmp_path / "3", up, b, paper_value=0.05) == "reproduced"


def test_a_claim_the_paper_gives_no_number_for_says_why_not_not_recorded(tmp_path):
    values = {("a", f"{w}.global_accuracy", s): 0.8 for s in range(5) for w in ("best", "final")}
    _write_runs(tmp_path / "r", values)
    spec = {"id": "x", "paper": "P", "claim": "a on its own", "where": "Fig. 5", "dataset": "-", "protocol": "-",
            "kind": "value", "folder": "r", "metric": "global_accuracy", "method": "a",
            "paper_none": "Fig. 5 plots it; the text gives no number"}
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump({"claims": [spec]}))
    row = _row(render(tmp_path, tmp_path / "claims.yaml"), "a on its own")
    assert row[4] == "none: Fig. 5 plots it; the text gives no number"
    assert row[8] == "**not judged: the paper gives no number**"


def test_every_judged_claim_has_the_papers_number_or_says_the_paper_gives_none():
    """The papers' texts are in ../shared/papers/: "not recorded" is left only where they give nothing."""
    claims = yaml.safe_load((REPO / "results" / "claims.yaml").read_text())["claims"]
    missing = [c["id"] for c in claims if c["kind"] != "not_run" and c.get("paper_value") is None
               and not c.get("paper_none")]
    assert missing == []
    assert "not recorded" not in (REPO / "results" / "FIDELITY.md").read_text()


@pytest.mark.parametrize(("key", "value"), [("chance", 1.5), ("chance", "ten"), ("negligible", -0.01)])
def test_bad_chance_or_negligible_is_refused(tmp_path, key, value):
    with pytest.raises(ConfigError, match=rf"claims: x: {key} {value!r} is not allowed: expected a number in"):
        _judge_pair(tmp_path, [0.5] * 5, [0.4] * 5, **{key: value})


def test_bad_claims_are_refused_with_the_key_and_what_is_allowed(tmp_path):
    root = _fixture(tmp_path)
    claims = yaml.safe_load((root / "claims.yaml").read_text())
    claims["claims"][0]["kind"] = "ranked"
    (root / "claims.yaml").write_text(yaml.safe_dump(claims))
    with pytest.raises(ConfigError, match=r"kind 'ranked' is not allowed: expected one of \['paired', 'value', "
                                          r"'not_run'\]"):
        render(root, root / "claims.yaml")
    claims["claims"][0].update(kind="paired", a={"method": "fedgen"})
    (root / "claims.yaml").write_text(yaml.safe_dump(claims))
    with pytest.raises(ConfigError, match="no 'best.global_accuracy' of method 'fedgen'"):
        render(root, root / "claims.yaml")
    claims["claims"][0].update(a={"method": "fsnet"}, point={"partition.alpha": 0.1})
    (root / "claims.yaml").write_text(yaml.safe_dump(claims))
    with pytest.raises(ConfigError, match="point key 'partition.alpha' is not a grid key"):
        render(root, root / "claims.yaml")


def test_the_committed_fidelity_table_is_what_the_results_give():
    """results/FIDELITY.md is never typed by hand: regenerating it from claims.yaml and runs.csv changes nothing."""
    results = REPO / "results"
    assert (results / "FIDELITY.md").read_text() == render(results, results / "claims.yaml")


def test_paired_text():
    assert Paired(0, math.nan, math.nan, math.nan, math.nan, 0, 0).text() == "-"
    r = paired([0.6, 0.7], [0.5, 0.5])
    assert r.text(scale=100, digits=1).startswith("+15.0 [")


def _script(name: str, folder: str = "results/paper"):
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, REPO / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("script", "folder", "argv", "error"), [
    ("tables", "results", [], "the following arguments are required: kind"),
    ("tables", "results", ["runs", "{tmp}"], "the following arguments are required: baseline"),
    ("tables", "results", ["runs", "{tmp}/nowhere", "fedavg"], "folder '{tmp}/nowhere' does not exist"),
    ("tables", "results", ["ranks", "{tmp}"], "invalid choice: 'ranks'"),
    ("fedmoe_table1", "results/paper", ["{tmp}"], "folder '{tmp}' has no runs.csv"),
    ("fsnet_rounds", "results/paper", ["{tmp}"], "folder '{tmp}' has no curves.csv"),
    ("cgau_protocol", "results/paper", ["{tmp}"], "folder '{tmp}' has no runs.csv"),
    ("fidelity", "results", ["--chek"], "unrecognized arguments: --chek"),
])
def test_results_scripts_refuse_bad_arguments_with_exit_2(tmp_path, capsys, script, folder, argv, error):
    with pytest.raises(SystemExit) as exit_:
        _script(script, folder).main([a.format(tmp=tmp_path) for a in argv])
    assert exit_.value.code == 2
    assert error.format(tmp=tmp_path) in capsys.readouterr().err


def test_the_runs_table_command_prints_the_table(tmp_path, capsys):
    root = _fixture(tmp_path)
    tables = _script("tables", "results")
    assert tables.main(["runs", str(root / "paper" / "shards"), "fedavg", "global_accuracy"]) == 0
    assert capsys.readouterr().out == tables.runs_table(root / "paper" / "shards", "fedavg",
                                                        ("global_accuracy",)) + "\n"


def test_the_paper_readme_tables_are_what_the_results_give():
    """results/paper/README.md's sensitivity, round, CGAU protocol and FedMoE Table 1 tables are the scripts' output on
    the committed runs.csv / curves.csv, never typed by hand."""
    readme = (REPO / "results" / "paper" / "README.md").read_text()
    sensitivity = _script("fsnet_sensitivity")
    assert sensitivity.table() in readme
    assert sensitivity.gain_vs_bound() in readme
    assert _script("cgau_protocol").table() in readme
    assert _script("fedmoe_table1").table() in readme
    for folder, key in (("optout_p0.8", "partition.opt_out"), ("optout_p0.2", "partition.opt_out"),
                        ("alpha", "partition.alpha")):
        assert _script("fedmoe_table1").table([REPO / "results" / "paper" / "fedmoe_fmnist" / folder],
                                              key=key) in readme
    assert _script("fsnet_rounds").round_table(REPO / "results" / "paper" / "fsnet_mnist" / "shards") in readme


def test_round_statistics_against_a_hand_computed_curve(tmp_path):
    rows = [("fedavg", r, v) for r, v in enumerate([0.2, 0.6, 0.4, 0.8], start=1)] + \
           [("fsnet", r, v) for r, v in enumerate([0.3, 0.7, 0.7, 0.8], start=1)]
    with open(tmp_path / "curves.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["seed", "method", "round", "metric", "value"])
        for method, r, v in rows:
            w.writerow([0, method, r, "global_accuracy", v])
    line = _script("fsnet_rounds").round_table(tmp_path, after=1).splitlines()[2]
    # fedavg mean 0.5; worst round after 1 is round 3 (0.4), fsnet there 0.7; fedavg < 0.5 in 2 of 4 rounds,
    # fsnet in 1; per-round differences +0.1 +0.1 +0.3 0 → mean +0.125, largest +0.3
    assert line == "| 0 | 0.500 | 0.400 (round 3) | 0.700 | 50% | 25% | +0.125 | +0.300 |"


def test_cgau_protocol_table_against_hand_computed_runs(tmp_path):
    """Means and paired differences of a two-seed, one-shuffle runs.csv, computed by hand."""
    rows = [(0, "relu", "best.local_accuracy_weighted", 0.80), (1, "relu", "best.local_accuracy_weighted", 0.90),
            (0, "cgau", "best.local_accuracy_weighted", 0.85), (1, "cgau", "best.local_accuracy_weighted", 0.93),
            (0, "relu", "best.global_accuracy", 0.70), (1, "relu", "best.global_accuracy", 0.72),
            (0, "cgau", "best.global_accuracy", 0.66), (1, "cgau", "best.global_accuracy", 0.73)]
    with open(tmp_path / "runs.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["partition.shuffle", "seed", "method", "metric", "value"])
        for seed, method, metric, v in rows:
            w.writerow([0.5, seed, method, metric, v])
    row = _script("cgau_protocol").table(tmp_path).splitlines()[2]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == "0.5"
    assert cells[1] == "0.850 / 0.890"  # ReLU (0.80 + 0.90) / 2, CGAU (0.85 + 0.93) / 2
    assert cells[2].startswith("+0.040 [") and cells[2].endswith("], 2/2")  # (0.05 + 0.03) / 2, CGAU won both
    assert cells[3] == "0.710 / 0.695"
    assert cells[4].startswith("−0.015 [") and cells[4].endswith("], 1/2")  # (−0.04 + 0.01) / 2


def test_fedmoe_table1_against_hand_computed_runs(tmp_path):
    """One p, two seeds: the four models' means and the paired mixture differences, computed by hand."""
    values = {  # (method, metric): (seed 0, seed 1)
        ("fedavg", "best.global_accuracy"): (0.70, 0.74), ("local", "best.global_accuracy"): (0.20, 0.16),
        ("finetuned", "best.global_accuracy"): (0.66, 0.68), ("mixture", "best.global_accuracy"): (0.69, 0.67),
        ("fedavg", "best.local_accuracy_mean"): (0.72, 0.70), ("local", "best.local_accuracy_mean"): (0.60, 0.64),
        ("finetuned", "best.local_accuracy_mean"): (0.86, 0.84), ("mixture", "best.local_accuracy_mean"): (0.85, 0.86),
    }
    with open(tmp_path / "runs.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["partition.p", "seed", "method", "metric", "value"])
        for (method, metric), pair in values.items():
            for seed, v in enumerate(pair):
                w.writerow([1.0, seed, method, metric, v])
    lines = _script("fedmoe_table1").table([tmp_path]).splitlines()
    glob, own = ([c.strip() for c in line.strip("|").split("|")] for line in lines[2:4])
    assert glob[:7] == ["1.0", "global", "2", "0.720", "0.180", "0.670", "0.680"]
    assert glob[7].startswith("+0.010 [") and glob[7].endswith("], 1/2")  # mixture − ft: +0.03, −0.01
    assert glob[8].startswith("+0.500 [") and glob[8].endswith("], 2/2")  # mixture − local: +0.49, +0.51
    assert own[:7] == ["1.0", "own", "2", "0.710", "0.620", "0.850", "0.855"]
    assert own[7].startswith("+0.005 [") and own[7].endswith("], 1/2")  # −0.01, +0.02
    assert own[8].startswith("+0.235 [") and own[8].endswith("], 2/2")  # +0.25, +0.22


def test_fedmoe_table1_groups_by_the_key_it_is_given(tmp_path):
    """Fig. 6 sweeps the opted-out fraction q: rows per q value, labelled q, each q's seeds paired on their own."""
    with open(tmp_path / "runs.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["partition.opt_out", "seed", "method", "metric", "value"])
        for q, mix in ((0.95, (0.60, 0.62)), (0.9, (0.70, 0.66))):
            for seed in (0, 1):
                for method, v in (("fedavg", 0.75), ("local", 0.2), ("finetuned", 0.65), ("mixture", mix[seed])):
                    for metric in ("best.global_accuracy", "best.local_accuracy_mean"):
                        w.writerow([q, seed, method, metric, v])
    lines = _script("fedmoe_table1").table([tmp_path], key="partition.opt_out").splitlines()
    assert lines[0].startswith("| q | test set |")
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [r[:2] for r in rows] == [["0.9", "global"], ["0.9", "own"], ["0.95", "global"], ["0.95", "own"]]
    assert rows[0][6] == "0.680" and rows[0][7].endswith("], 2/2")  # q = 0.9: +0.05, +0.01 → +0.03, both won
    assert rows[0][7].startswith("+0.030 [")
    assert rows[2][6] == "0.610" and rows[2][7].startswith("−0.040 [") and rows[2][7].endswith("], 0/2")


def test_every_verdict_of_the_committed_table_follows_the_written_rules():
    """#72 §1: re-derive each paper claim's verdict head from its own statistics (the CI, the paper's difference,
    the Holm-adjusted p) and compare; hetfed's own comparisons are listed apart and not counted."""
    import math

    from hetfed.analysis import fidelity as f

    claims = f.load_claims(REPO / "results" / "claims.yaml")
    judged = f._holm([f.judge(REPO / "results", c) for c in claims])
    text = (REPO / "results" / "FIDELITY.md").read_text()
    counted = text.split("## Count (the papers' claims)")[1]
    assert sum(int(n) for n in re.findall(r": (\d+)", counted)) == sum(1 for j in judged if not j.own)
    holm_p = {}
    for j in judged:
        m = re.search(r"Holm p = ([0-9.e+-]+)", j.statistic)
        if m:
            holm_p[j.claim["id"]] = float(m.group(1))
    checked = 0
    for j in judged:
        c = j.claim
        if c["kind"] != "paired" or j.own or c.get("chance") is not None and j.verdict.startswith("at chance"):
            continue
        direction = int(c.get("direction", 1))
        r = j.stats[c.get("select", "best")]
        head = j.verdict.split(" (")[0]
        if direction == 0:
            assert head in ("reproduced", "not reproduced", "inconclusive", "too few seeds"), (c["id"], head)
            continue
        lo, hi = sorted((r.ci_low * direction, r.ci_high * direction))
        size = c.get("paper_value")
        outside = size is not None and not r.ci_low <= float(size) <= r.ci_high
        significant = holm_p[c["id"]] < f.FAMILY_ALPHA
        if lo > 0:
            expected = ({"reproduced in sign, not in size"} if outside else
                        {"reproduced", "reproduced in sign, negligible in size"}) if significant else {f.NOT_AFTER_HOLM}
        elif hi < 0:
            expected = {"opposite"} if significant else {f.NOT_OPPOSITE_AFTER_HOLM}
        elif r.mean * direction > 0:
            expected = {f.OUTSIDE} if outside else {"trend"}
        else:
            expected = {"not reproduced"}
        assert head in expected, (c["id"], head, expected, r)
        assert not (head == "trend" and outside)  # a CI that excludes the paper's difference is no trend
        checked += 1
    assert checked >= 35
    # the claims the papers do not make are apart: Fed-FSNet against FedProx / SCAFFOLD, FedMoE's Local rows
    own = {j.claim["id"] for j in judged if j.own}
    assert {"fsnet-t2-mnist-vs-fedprox", "fsnet-t2-fmnist-vs-scaffold", "fedmoe-fig5-alpha001-global",
            "fedmoe-fig6-optout-q09-p08-local"} <= own
    assert all(not math.isnan(j.stats["best"].t_p) for j in judged if j.claim["kind"] == "paired" and j.stats)


def test_holms_adjustment_against_its_definition():
    from hetfed.analysis.paired import holm

    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, float("nan")])[0] == 0.5 and math.isnan(holm([0.5, float("nan")])[1])


def test_a_reproduced_claim_is_downgraded_when_holms_correction_takes_its_significance(tmp_path):
    """One claim significant alone (t p ≈ 0.03) but not in a family of ten where the others say nothing."""
    from hetfed.analysis import fidelity as f

    rows = {}
    specs = []
    for k in range(10):
        b = [0.70, 0.71, 0.72, 0.73, 0.74]
        diff = [0.02, 0.001, 0.015, 0.006, 0.012] if k == 0 else [0.02, -0.02, 0.01, -0.01, 0.0]
        for s in range(5):
            for w in ("best", "final"):
                rows[(f"a{k}", f"{w}.global_accuracy", s)] = b[s] + diff[s]
                rows[(f"b{k}", f"{w}.global_accuracy", s)] = b[s]
        specs.append({"id": f"c{k}", "paper": "P", "claim": f"a{k} beats b{k}", "where": "-", "dataset": "-",
                      "protocol": "-", "kind": "paired", "folder": "r", "metric": "global_accuracy",
                      "a": {"method": f"a{k}"}, "b": {"method": f"b{k}"}})
    _write_runs(tmp_path / "r", rows)
    (tmp_path / "claims.yaml").write_text(yaml.safe_dump({"claims": specs}))
    alone = f._holm([f.judge(tmp_path, specs[0])])[0]
    assert alone.verdict == "reproduced"
    text = render(tmp_path, tmp_path / "claims.yaml")
    assert _row(text, "a0 beats b0")[8] == f"**{f.NOT_AFTER_HOLM}**"
    assert "Family: the papers' 10 directional comparisons" in text


def test_every_paper_claim_cites_the_sentence_or_table_cell_it_comes_from():
    """#72 §1: a judged claim names where the paper says it — a quoted sentence or a table cell with its number."""
    claims = yaml.safe_load((REPO / "results" / "claims.yaml").read_text())["claims"]
    bare = [c["id"] for c in claims if not c.get("own") and c["kind"] != "not_run"
            and '"' not in c["where"] and not re.search(r":\s*[\d.]+", c["where"])
            and not re.search(r"\d+\.\d", c["where"]) and "plotted only" not in c["where"]]
    assert bare == []
