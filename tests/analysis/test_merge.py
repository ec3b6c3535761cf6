"""``hetfed merge``: sweeps of one config on different seeds combined from their tables alone."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
from scipy import stats

from hetfed.analysis.merge import merge_sweeps
from hetfed.cli import main
from hetfed.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def _write(path: Path, rows: list[list]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows(rows)


def _runs(folder: Path, seeds: dict[int, dict[str, float]]) -> Path:
    """A runs.csv over the grid key partition.p (0.5 and 1.0): seed → {point: fedavg's best.global_accuracy};
    Γ is 10 × the accuracy, so the heterogeneity table can be checked too."""
    rows: list[list] = [["partition.p", "seed", "method", "metric", "value"]]
    for seed, per_point in seeds.items():
        for p, acc in per_point.items():
            rows += [[p, seed, "(data)", "gamma", repr(10 * acc)], [p, seed, "fedavg", "best.global_accuracy",
                                                                    repr(acc)]]
    _write(folder / "runs.csv", rows)
    curves: list[list] = [["partition.p", "seed", "method", "round", "metric", "value"]]
    for seed, per_point in seeds.items():
        for p, acc in per_point.items():
            curves += [[p, seed, "fedavg", r, "global_accuracy", repr(acc * r / 2)] for r in (1, 2)]
    _write(folder / "curves.csv", curves)
    return folder


def _table(path: Path) -> dict[tuple[str, str, str], dict[str, str]]:
    with open(path, newline="") as fh:
        return {(r.get("partition.p", ""), r["method"], r["metric"]): r for r in csv.DictReader(fh)}


def _t_ci(values: list[float]) -> float:
    """The textbook 95% half-width: t(0.975, n − 1) · s / √n."""
    n = len(values)
    mean = sum(values) / n
    s = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return stats.t.ppf(0.975, n - 1) * s / math.sqrt(n)


@pytest.mark.draws
def test_merged_means_and_cis_are_over_every_seed_of_both_sweeps(tmp_path):
    a = _runs(tmp_path / "a", {0: {"0.5": 0.80, "1.0": 0.40}, 1: {"0.5": 0.84, "1.0": 0.30}})
    b = _runs(tmp_path / "b", {2: {"0.5": 0.86, "1.0": 0.50}, 3: {"0.5": 0.78, "1.0": 0.20}})
    merged = merge_sweeps([a, b], tmp_path / "m")
    assert merged.seeds == [0, 1, 2, 3] and merged.curves
    table = _table(tmp_path / "m" / "sweep.csv")
    for p, values in (("0.5", [0.80, 0.84, 0.86, 0.78]), ("1.0", [0.40, 0.30, 0.50, 0.20])):
        row = table[p, "fedavg", "best.global_accuracy"]
        assert float(row["mean"]) == pytest.approx(sum(values) / 4)
        assert float(row["ci95"]) == pytest.approx(_t_ci(values))
        assert row["n"] == "4"
    with open(tmp_path / "m" / "heterogeneity.csv", newline="") as fh:
        het = {r["partition.p"]: float(r["mean"]) for r in csv.DictReader(fh) if r["metric"] == "gamma"}
    assert het == pytest.approx({"0.5": 8.2, "1.0": 3.5})
    # runs.csv: every row of both, grouped by point, seeds in order
    with open(tmp_path / "m" / "runs.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == 16
    assert [(r["partition.p"], r["seed"]) for r in rows if r["metric"] == "gamma"] == [
        ("0.5", "0"), ("0.5", "1"), ("0.5", "2"), ("0.5", "3"), ("1.0", "0"), ("1.0", "1"), ("1.0", "2"), ("1.0", "3")]
    with open(tmp_path / "m" / "curves.csv", newline="") as fh:
        assert len(list(csv.DictReader(fh))) == 16
    assert (tmp_path / "m" / "figures" / "curves_global_accuracy.png").is_file()
    record = json.loads((tmp_path / "m" / "sweep.json").read_text())
    assert record["grid"] == {"partition.p": [0.5, 1.0]} and record["seeds"] == 4
    assert record["merged_from"] == [str(a), str(b)]


@pytest.mark.draws
@pytest.mark.slow
def test_merging_two_seed_ranges_gives_the_sweep_over_both(tmp_path, capsys):
    """A sweep over seeds {0, 1} and the merge of sweeps run on {0} and on {1}: the same tables."""
    config = str(REPO / "configs" / "default.yaml")
    fast = ["--set", "train.rounds=2", "--set", "train.eval_every=1", "--grid", "partition.shuffle=0,1", "--quiet"]
    assert main(["sweep", config, *fast, "--seeds", "2", "--out", str(tmp_path / "both")]) == 0
    assert main(["sweep", config, *fast, "--seeds", "1", "--out", str(tmp_path / "s0")]) == 0
    assert main(["sweep", config, *fast, "--set", "seed=1", "--seeds", "1", "--out", str(tmp_path / "s1")]) == 0
    assert main(["merge", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(tmp_path / "m")]) == 0
    assert "seeds 0, 1" in capsys.readouterr().out
    def rows(path: Path) -> list[tuple]:  # timings differ between any two runs; every other value is the seed's
        with open(path, newline="") as fh:
            return sorted(tuple(r) for r in csv.reader(fh) if not any("seconds" in cell for cell in r))

    for name in ("sweep.csv", "runs.csv", "heterogeneity.csv"):
        assert rows(tmp_path / "m" / name) == rows(tmp_path / "both" / name), name
    with open(tmp_path / "both" / "curves.csv", newline="") as fh, open(tmp_path / "m" / "curves.csv") as gh:
        assert sorted(csv.reader(fh)) == sorted(csv.reader(gh))
    assert main(["report", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "report.html").is_file()


def test_a_real_sweep_split_by_seed_merges_back_to_its_table(tmp_path):
    """The committed Fig. 5 folder (5 seeds) cut into seeds 0–2 and 3–4: the merge gives its sweep.csv back."""
    src = REPO / "results" / "paper" / "fedmoe_fmnist" / "alpha"
    for name in ("runs.csv", "curves.csv"):
        with open(src / name, newline="") as fh:
            rows = list(csv.reader(fh))
        i = rows[0].index("seed")
        _write(tmp_path / "a" / name, [rows[0], *[r for r in rows[1:] if int(r[i]) < 3]])
        _write(tmp_path / "b" / name, [rows[0], *[r for r in rows[1:] if int(r[i]) >= 3]])
    merge_sweeps([tmp_path / "a", tmp_path / "b"], tmp_path / "m")
    with open(src / "sweep.csv", newline="") as fh, open(tmp_path / "m" / "sweep.csv", newline="") as gh:
        assert sorted(csv.reader(fh)) == sorted(csv.reader(gh))


def _assert_refused(tmp_path: Path, capsys, args: list[str], *needles: str) -> None:
    code = main(["merge", *args])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not (tmp_path / "m").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".m.")]  # no temporary folder left


def test_bad_merges_are_refused_with_one_line_and_nothing_written(tmp_path, capsys):
    a = _runs(tmp_path / "a", {0: {"0.5": 0.8}})
    b = _runs(tmp_path / "b", {0: {"0.5": 0.7}, 1: {"0.5": 0.9}})
    out = ["--out", str(tmp_path / "m")]
    _assert_refused(tmp_path, capsys, [str(a), str(b), *out], "seed 0", "partition.p=0.5", str(a), str(b))
    _assert_refused(tmp_path, capsys, [str(a), *out], "1 sweep folder", "two or more")
    _assert_refused(tmp_path, capsys, [str(a), str(tmp_path / "none"), *out], "runs.csv is missing")
    other = tmp_path / "other"
    _write(other / "runs.csv", [["partition.alpha", "seed", "method", "metric", "value"], [1, 5, "fedavg", "x", 1.0]])
    _assert_refused(tmp_path, capsys, [str(a), str(other), *out], "same grid keys")
    c = _runs(tmp_path / "c", {1: {"0.5": 0.7}})
    (a / "sweep_request.json").write_text(json.dumps({"config": {"seed": 0, "train": {"rounds": 50}}, "grid": {}}))
    (c / "sweep_request.json").write_text(json.dumps({"config": {"seed": 1, "train": {"rounds": 60}}, "grid": {}}))
    _assert_refused(tmp_path, capsys, [str(a), str(c), *out], "different config", "train.rounds: 50 → 60")
    (c / "sweep_request.json").write_text(json.dumps({"config": {"seed": 1, "train": {"rounds": 50}}, "grid": {}}))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    code = main(["merge", str(a), str(c), "--out", str(tmp_path / "full")])
    err = capsys.readouterr().err
    assert code == 2 and "already holds files" in err and (tmp_path / "full" / "x").is_file()
    assert main(["merge", str(a), str(c), "--out", str(tmp_path / "m")]) == 0  # differs in the seed only: merged


def test_other_values_of_the_swept_key_extend_the_grid(tmp_path):
    a = _runs(tmp_path / "a", {0: {"0.5": 0.8}, 1: {"0.5": 0.6}})
    b = _runs(tmp_path / "b", {0: {"1.0": 0.4}, 1: {"1.0": 0.2}})
    for folder, p in ((a, 0.5), (b, 1.0)):  # each sweep's base config holds its own grid value and seed
        (folder / "sweep_request.json").write_text(json.dumps(
            {"config": {"seed": 0, "partition": {"p": p, "clients": 10}}, "grid": {"partition.p": [p]}}))
    merge_sweeps([a, b], tmp_path / "m")
    table = _table(tmp_path / "m" / "sweep.csv")
    assert float(table["0.5", "fedavg", "best.global_accuracy"]["mean"]) == pytest.approx(0.7)
    assert float(table["1.0", "fedavg", "best.global_accuracy"]["mean"]) == pytest.approx(0.3)
    assert json.loads((tmp_path / "m" / "sweep.json").read_text())["grid"] == {"partition.p": [0.5, 1.0]}
    (b / "sweep_request.json").write_text(json.dumps(
        {"config": {"seed": 0, "partition": {"p": 1.0, "clients": 20}}, "grid": {"partition.p": [1.0]}}))
    with pytest.raises(ConfigError, match="partition.clients: 10 → 20"):
        merge_sweeps([a, b], tmp_path / "m2")


def test_a_folder_without_curves_merges_its_tables_only(tmp_path):
    a = _runs(tmp_path / "a", {0: {"0.5": 0.8}})
    b = _runs(tmp_path / "b", {1: {"0.5": 0.6}})
    (b / "curves.csv").unlink()
    merged = merge_sweeps([a, b], tmp_path / "m")
    assert not merged.curves and not (tmp_path / "m" / "curves.csv").exists()
    assert float(_table(tmp_path / "m" / "sweep.csv")["0.5", "fedavg", "best.global_accuracy"]["mean"]) == \
        pytest.approx(0.7)


def test_the_library_call_refuses_like_the_command(tmp_path):
    a = _runs(tmp_path / "a", {0: {"0.5": 0.8}})
    with pytest.raises(ConfigError, match="seed 0"):
        merge_sweeps([a, a], tmp_path / "m")
