"""``hetfed sweep --each-method`` (#74 §1): each of a config's methods a run of its own, gathered as one run's in the
tables — so a stacked sweep trains every method's runs side by side, sharing a stack where their steps are the same
computation, instead of one method's runs at a time."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

from hetfed.algorithms import registry
from hetfed.cli import main
from hetfed.executors import stacked_runs

REPO = Path(__file__).resolve().parents[2]
#: FedAvg, kNN-Per (FedAvg's step unchanged) and FedProx (a step of its own), on their quick parameters
METHODS = "methods=" + json.dumps([{"algorithm": m, "params": dict(registry.get(m).quick)}
                                   for m in ("fedavg", "knnper", "fedprox")])
ARGS = ["sweep", str(REPO / "configs" / "default.yaml"), "--set", "train.rounds=3", "--set", "partition.clients=4",
        "--set", "train.local_steps=2", "--set", "heterogeneity.iid_draws=0", "--set", "train.eval_every=1",
        "--set", METHODS, "--seeds", "2", "--quiet", "--no-report"]


def _sweep(out: Path, *flags: str) -> Path:
    assert main([*ARGS, *flags, "--out", str(out)]) == 0, (out / "sweep.json").read_text()
    return out


def _table(path: Path) -> list[list[str]]:
    """A sweep table's rows but its timings (a run's seconds are its own)."""
    return [row for row in csv.reader(path.open()) if "seconds" not in ",".join(row)]


def _runs(path: Path) -> dict[tuple[str, ...], float]:
    """runs.csv by seed, method and metric, timings left out."""
    return {(r["seed"], r["method"], r["metric"]): float(r["value"]) for r in csv.DictReader((path / "runs.csv").open())
            if "seconds" not in r["metric"]}


def _as_one_by_one(stacked: dict[tuple[str, ...], float], alone: dict[tuple[str, ...], float]) -> None:
    """A stacked sweep's runs.csv is the one-by-one sweep's: to the bit, but the validation losses, to float32's
    tolerance (a joined evaluation computes the logits in blocks of other shapes, tests/runs/test_stacked_sweep.py)."""
    assert stacked.keys() == alone.keys()
    assert not {k: (v, alone[k]) for k, v in stacked.items() if not (
        v == alone[k] or (k[-1].endswith("val_loss") and math.isclose(v, alone[k], rel_tol=1e-6)))}


def test_each_methods_runs_train_side_by_side_and_give_the_whole_runs_tables(tmp_path, monkeypatch):
    trained: list[tuple[str, ...]] = []
    original = stacked_runs.train_together
    monkeypatch.setattr(stacked_runs, "train_together", lambda group: trained.append(
        tuple(sorted(r.executor.algo.spec.name for r in group))) or original(group))
    whole = _sweep(tmp_path / "whole")
    stacked = _sweep(tmp_path / "stacked", "--stack")
    assert set(trained) == {("fedavg", "fedavg"), ("knnper", "knnper"), ("fedprox", "fedprox")}  # one at a time
    trained.clear()
    prepared: list[int] = []
    from hetfed import pipeline

    preparing = pipeline._prepare
    monkeypatch.setattr(pipeline, "_prepare", lambda *a: prepared.append(1) or preparing(*a))
    each = _sweep(tmp_path / "each", "--stack", "--each-method")
    assert len(prepared) == 2  # a seed's data, partition and Γ once for its three methods' runs
    # kNN-Per trains with FedAvg's step: both methods' runs of both seeds in one stack; FedProx's apart, beside them
    assert trained == [("fedavg", "fedavg", "knnper", "knnper"), ("fedprox", "fedprox")] * 3, trained
    _as_one_by_one(_runs(each), _runs(whole))
    _as_one_by_one(_runs(stacked), _runs(whole))
    assert _table(each / "heterogeneity.csv") == _table(whole / "heterogeneity.csv")
    for seed in (0, 1):  # each method's own run directory, holding its method alone
        for label in ("fedavg", "knnper", "fedprox"):
            summary = json.loads((each / "base" / f"seed={seed}" / f"method={label}" / "summary.json").read_text())
            assert list(summary["methods"]) == [label]
    record = json.loads((each / "sweep.json").read_text())
    assert [(r["seed"], r["method"]) for r in record["runs"]] == [
        (s, m) for s in (0, 1) for m in ("fedavg", "knnper", "fedprox")]
    assert json.loads((each / "sweep_request.json").read_text())["each_method"] is True


def test_a_sweep_of_each_method_resumes_its_finished_runs_and_needs_no_stack(tmp_path, capsys):
    each = _sweep(tmp_path / "each", "--each-method", "--set", "train.rounds=2")
    finished = {p: p.stat().st_mtime_ns for p in each.rglob("summary.json")}
    assert len(finished) == 6
    (each / "base" / "seed=1" / "method=fedprox" / "summary.json").unlink()  # as if killed before it finished
    assert main([*ARGS, "--each-method", "--set", "train.rounds=2", "--resume", "--out", str(each)]) == 0
    again = {p: p.stat().st_mtime_ns for p in each.rglob("summary.json")}
    assert {p: t for p, t in again.items() if finished.get(p) != t} == {
        each / "base" / "seed=1" / "method=fedprox" / "summary.json": again[
            each / "base" / "seed=1" / "method=fedprox" / "summary.json"]}  # only the unfinished one ran again
    assert main([*ARGS, "--set", "train.rounds=2", "--resume", "--out", str(each)]) == 2  # its runs are one a method
    said = capsys.readouterr().err
    assert "without --each-method is not allowed: the sweep was made with it" in said, said
    whole = _sweep(tmp_path / "whole", "--set", "train.rounds=2")
    assert main([*ARGS, "--each-method", "--set", "train.rounds=2", "--resume", "--out", str(whole)]) == 2
    for table in ("runs.csv", "sweep.csv", "curves.csv", "heterogeneity.csv"):  # one by one: the same, to the bit
        assert _table(each / table) == _table(whole / table), table


def test_a_method_beside_one_that_needs_server_data_trains_on_the_same_clients_apart(tmp_path):
    """``server_data.source: auto`` cuts a holdout from the clients' pool when any method of the config needs one
    (FedDF's distillation set): FedAvg beside FedDF trains on less data than FedAvg alone. Apart, it keeps the whole
    config's clients: the tables are the whole run's to the bit."""
    methods = "methods=" + json.dumps([{"algorithm": "fedavg"}, {"algorithm": "feddf",
                                                                 "params": dict(registry.get("feddf").quick)}])
    args = [*ARGS[:ARGS.index(METHODS) - 1], *ARGS[ARGS.index(METHODS) + 1:], "--set", methods, "--set",
            "server_data.max_samples=60", "--seeds", "1", "--set", "train.rounds=2"]
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    assert main([*args, "--each-method", "--out", str(tmp_path / "each")]) == 0
    assert _table(tmp_path / "each" / "runs.csv") == _table(tmp_path / "whole" / "runs.csv")
