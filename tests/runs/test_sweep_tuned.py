"""Each method at the grid point its validation chose (:func:`hetfed.runs.sweep_tables.tuned`): what a user compares
methods by when a sweep's grid holds their settings — chosen without their test scores, within each task."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hetfed
from hetfed.cli import main
from hetfed.errors import ConfigError
from hetfed.runs.sweep_tables import tuned, tuned_held_out, tuned_over, tuned_rows


def _row(lr, alpha, method, metric, mean, n=3):
    return {"train.optimizer.lr": lr, "partition.alpha": alpha, "method": method, "metric": metric, "mean": mean,
            "ci95": 0.01, "n": n}


KEYS = ["train.optimizer.lr", "partition.alpha"]


def test_the_lowest_validation_loss_is_chosen_within_each_task_and_the_highest_accuracy():
    rows = [
        _row(0.1, 0.5, "fedavg", "best.val_loss", 0.9), _row(0.3, 0.5, "fedavg", "best.val_loss", 0.7),
        _row(0.1, 1.0, "fedavg", "best.val_loss", 0.4), _row(0.3, 1.0, "fedavg", "best.val_loss", 0.8),
        _row(0.1, 0.5, "ditto", "best.val_loss", float("nan")), _row(0.3, 0.5, "ditto", "best.val_loss", 1.2),
        _row(0.1, 1.0, "ditto", "best.val_loss", 1.0), _row(0.3, 1.0, "ditto", "best.val_loss", 1.0),  # a tie
        _row(0.1, 0.5, "(data)", "best.val_loss", 0.0),  # Γ's rows are not a method
        _row(0.1, 0.5, "fedavg", "best.global_accuracy", 0.95), _row(0.3, 0.5, "fedavg", "best.global_accuracy", 0.5),
    ]
    # partition.alpha is another task: chosen within each of its values, never across them
    assert tuned_over(KEYS) == ["train.optimizer.lr"]
    assert tuned(rows, KEYS) == {("fedavg", (0.5,)): (0.3, 0.5), ("fedavg", (1.0,)): (0.1, 1.0),
                                 ("ditto", (0.5,)): (0.3, 0.5),  # NaN skipped
                                 ("ditto", (1.0,)): (0.1, 1.0)}  # the first on a tie
    # a metric that is not a loss: the highest
    assert tuned(rows, KEYS, "best.global_accuracy") == {("fedavg", (0.5,)): (0.1, 0.5)}
    chosen = tuned_rows(rows, KEYS, shown=["best.global_accuracy"])
    first = chosen[0]
    assert (first["method"], first["point"], first["by"]) == ("fedavg", {"train.optimizer.lr": 0.3,
                                                                         "partition.alpha": 0.5}, 0.7)
    assert first["best.global_accuracy"]["mean"] == 0.5  # the test metric at the chosen point, not its best
    # a grid of the task's or the scenario's keys holds nothing to choose: the weakest attack or the loosest ε would be
    # "chosen" by the validation loss
    assert tuned_over(["partition.alpha", "dataset.name", "attack.fraction", "privacy.noise_multiplier",
                       "train.rounds", "train.client_fraction", "server.compression.kind"]) == []
    assert tuned_over(["train.optimizer.lr", "train.local_epochs", "model.hidden", "server.optimizer.lr",
                       "methods.0.params.mu", "methods", "train.optimizer"]) == [
        "train.optimizer.lr", "train.local_epochs", "model.hidden", "server.optimizer.lr", "methods.0.params.mu",
        "methods", "train.optimizer"]
    assert tuned_rows(rows, ["partition.alpha"]) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.01, 0.1, 1.0]), st.sampled_from(["a", "b"]),
                          st.one_of(st.floats(0, 10), st.just(float("nan")))), min_size=1, max_size=12),
       st.sampled_from(["best.val_loss", "best.val_accuracy"]))
def test_no_point_of_the_same_task_beats_the_chosen_one(cells, by):
    rows = [{"train.optimizer.lr": lr, "method": m, "metric": by, "mean": v, "ci95": 0.0, "n": 1} for lr, m, v in cells]
    chosen = tuned(rows, ["train.optimizer.lr"], by)
    for method in {m for _, m, _ in cells}:
        finite = [r for r in rows if r["method"] == method and math.isfinite(r["mean"])]
        if not finite:
            assert (method, ()) not in chosen
            continue
        best = (min if by.endswith("loss") else max)(r["mean"] for r in finite)
        first = next(r for r in finite if r["mean"] == best)  # the first row with it, in the table's order
        assert chosen[(method, ())] == (first["train.optimizer.lr"],)


def _value(lr, seed, metric, value, method="fedavg"):
    return {"train.optimizer.lr": lr, "seed": seed, "method": method, "metric": metric, "value": value}


def test_held_out_each_seeds_metric_is_taken_where_the_other_seeds_chose():
    """Leave one seed out: all three seeds choose lr 0.3 (mean validation loss 0.30 < 0.37), but seed 0 alone favours
    0.1 — held out, seeds 1 and 2 are scored where seeds {0, 2} and {0, 1} chose (0.1: 0.30 < 0.35), seed 0 where
    {1, 2} chose (0.3)."""
    losses = {(0.1, 0): 0.1, (0.3, 0): 0.5, (0.1, 1): 0.5, (0.3, 1): 0.2, (0.1, 2): 0.5, (0.3, 2): 0.2}
    accuracy = {(0.1, 0): 0.9, (0.3, 0): 0.6, (0.1, 1): 0.5, (0.3, 1): 0.7, (0.1, 2): 0.4, (0.3, 2): 0.8}
    values = [_value(lr, seed, "best.val_loss", v) for (lr, seed), v in losses.items()]
    values += [_value(lr, seed, "best.global_accuracy", v) for (lr, seed), v in accuracy.items()]
    values += [{"train.optimizer.lr": 0.1, "seed": 0, "method": "(data)", "metric": "gamma", "value": 1.0}]
    rows = [{"train.optimizer.lr": lr, "method": "fedavg", "metric": "best.val_loss", "ci95": 0.0, "n": 3,
             "mean": sum(v for (p, _), v in losses.items() if p == lr) / 3} for lr in (0.1, 0.3)]
    assert tuned(rows, ["train.optimizer.lr"]) == {("fedavg", ()): (0.3,)}  # all seeds: 0.3
    (row,) = tuned_held_out(values, ["train.optimizer.lr"], metrics=["best.global_accuracy"])
    assert row["chosen"] == {"train.optimizer.lr=0.3": 1, "train.optimizer.lr=0.1": 2}
    assert row["best.global_accuracy"]["mean"] == pytest.approx((0.6 + 0.5 + 0.4) / 3)  # not 0.7's (all seeds' pick)
    assert row["best.global_accuracy"]["n"] == 3
    assert tuned_held_out(values[:2] + values[6:8], ["train.optimizer.lr"]) == []  # one seed: nothing held out
    # within each value of a task's key (partition.alpha): a choice of its own, the key's value in its row
    tasks = [{**v, "partition.alpha": alpha} for alpha in (0.5, 1.0) for v in values]
    tasks = [v for v in tasks if not (v["partition.alpha"] == 1.0 and v["train.optimizer.lr"] == 0.1)]
    by_task = {r["partition.alpha"]: r for r in tuned_held_out(tasks, KEYS, metrics=["best.global_accuracy"])}
    assert by_task[0.5]["chosen"] == row["chosen"] and by_task[1.0]["chosen"] == {"train.optimizer.lr=0.3": 3}
    assert by_task[1.0]["best.global_accuracy"]["mean"] == pytest.approx((0.6 + 0.7 + 0.8) / 3)
    assert tuned_held_out([v for v in values if v["train.optimizer.lr"] == 0.1], ["train.optimizer.lr"]) == []


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("tuned") / "s"
    config = {"train": {"rounds": 2}, "methods": [{"algorithm": "fedavg"}, {"name": "prox", "algorithm": "fedprox"}],
              "heterogeneity": {"iid_draws": 0, "given_label": False}}
    return hetfed.sweep(config, {"train.optimizer.lr": [0.02, 0.3]}, seeds=3, out=out)


def test_a_sweeps_choice_is_its_tables_lowest_validation_loss_and_its_test_metrics_there(sweep):
    table = sweep.table()
    chosen = sweep.tuned()
    assert sorted(chosen["method"]) == ["fedavg", "prox"]
    for _, row in chosen.iterrows():
        losses = table[(table["method"] == row["method"]) & (table["metric"] == "best.val_loss")]
        best = losses.loc[losses["mean"].idxmin()]
        assert row["train.optimizer.lr"] == best["train.optimizer.lr"] and row["best.val_loss"] == best["mean"]
        there = table[(table["method"] == row["method"]) & (table["metric"] == "best.global_accuracy")
                      & (table["train.optimizer.lr"] == best["train.optimizer.lr"])].iloc[0]
        assert row["best.global_accuracy"] == pytest.approx(there["mean"], rel=1e-12)
        assert row["best.global_accuracy.ci95"] == pytest.approx(there["ci95"], rel=1e-9)
        assert row["best.global_accuracy.n"] == 3
    with pytest.raises(ConfigError, match=r"^metric 'best.val_los' is not in this sweep: expected one of \["):
        sweep.tuned(by="best.val_los")
    # runs.csv keeps each run's validation scores (what the choice is made from, for a merge or a paired test)
    assert {"best.val_loss", "best.val_accuracy"} <= set(sweep.values()["metric"])


def test_held_out_every_seed_is_scored_where_the_other_seeds_validation_loss_was_lowest(sweep):
    values = sweep.values()
    held = sweep.tuned(held_out=True).set_index("method")
    for method in ("fedavg", "prox"):
        mine = values[values["method"] == method]
        loss = mine[mine["metric"] == "best.val_loss"].pivot(index="seed", columns="train.optimizer.lr", values="value")
        accuracy = mine[mine["metric"] == "best.global_accuracy"].pivot(index="seed", columns="train.optimizer.lr",
                                                                        values="value")
        picks = {seed: loss.drop(index=seed).mean().idxmin() for seed in loss.index}
        assert held.loc[method, "best.global_accuracy"] == pytest.approx(
            sum(accuracy.loc[seed, lr] for seed, lr in picks.items()) / 3, rel=1e-12)
        assert sum(held.loc[method, "chosen"].values()) == held.loc[method, "best.global_accuracy.n"] == 3


def test_two_methods_each_at_its_chosen_setting_are_paired_by_seed(sweep):
    """`paired(…, tuned_by="best.val_loss")`: each method's values at the point its validation chose, paired by seed
    (the per-seed differences' mean), the two points named."""
    chosen = sweep.tuned().set_index("method")["train.optimizer.lr"]
    values = sweep.values()
    at = values[values["metric"] == "best.global_accuracy"]

    def seeds(method):
        rows = at[(at["method"] == method) & (at["train.optimizer.lr"] == chosen[method])]
        return rows.set_index("seed")["value"].sort_index()

    (row,) = sweep.paired("prox", "fedavg", tuned_by="best.val_loss").to_dict("records")
    assert row["method_point"] == {"train.optimizer.lr": chosen["prox"]}
    assert row["baseline_point"] == {"train.optimizer.lr": chosen["fedavg"]}
    diff = seeds("prox") - seeds("fedavg")
    assert row["n"] == 3 and row["mean"] == pytest.approx(diff.mean(), rel=1e-12, abs=1e-15)
    assert row["wins"] == int((diff > 0).sum())
    with pytest.raises(ConfigError, match=r"^metric 'best.val_los' is not in this sweep"):
        sweep.paired("prox", "fedavg", tuned_by="best.val_los")


FAST = ["--set", "train.rounds=2", "--set", "methods=[{algorithm: fedavg}]", "--set", "heterogeneity.iid_draws=0",
        "--set", "heterogeneity.given_label=false", "--seeds", "1", "--no-report"]


def test_the_report_and_the_console_show_each_method_at_its_chosen_setting(sweep, tmp_path, capsys):
    page = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", sweep.report(tmp_path / "r.html").read_text()))
    assert "each method at its chosen setting" in page
    assert "chosen by its clients' validation loss" in page.replace("&#x27;", "'")
    held = sweep.tuned(held_out=True).set_index("method")  # and each seed where the other seeds chose
    assert "leave one seed out" in page and all(
        f"{method} {'; '.join(f'{p} ({n})' for p, n in held.loc[method, 'chosen'].items())} "
        f"{held.loc[method, 'best.global_accuracy']:.3f} ±" in page for method in held.index)
    assert main(["sweep", *FAST, "--grid", "train.optimizer.lr=0.02,0.3", "--out", str(tmp_path / "s")]) == 0
    assert "each method at the train.optimizer.lr its validation chose" in capsys.readouterr().out


def test_a_grid_with_no_setting_to_choose_shows_no_choice_and_the_api_refuses_one(tmp_path, capsys):
    """A grid over the partition alone: each value is another task, whose validation losses are not comparable."""
    assert main(["sweep", *FAST, "--grid", "partition.shuffle=0,1", "--out", str(tmp_path / "s")]) == 0
    assert "its validation chose" not in capsys.readouterr().out
    with pytest.raises(ConfigError, match=r"holds no setting to choose: expected a grid over one of a method's own"):
        hetfed.open_sweep(tmp_path / "s").tuned()


def test_a_grid_over_methods_each_named_once_offers_no_choice(tmp_path, capsys):
    """Each method has one point of such a grid: its "chosen" point would be the only one (the table printed it). A
    method named at two points (FedProx at two μ) is chosen between them."""
    at = FAST.index("methods=[{algorithm: fedavg}]")
    fast = FAST[:at - 1] + FAST[at + 1:]  # the grid sets the methods
    once = "methods=[{algorithm: fedavg}],[{name: prox, algorithm: fedprox}]"
    assert main(["sweep", *fast, "--grid", once, "--out", str(tmp_path / "once")]) == 0
    assert "its validation chose" not in capsys.readouterr().out
    assert hetfed.open_sweep(tmp_path / "once").tuned().empty
    twice = "methods=[{name: prox, algorithm: fedprox, params: {mu: 0.01}}],[{name: prox, algorithm: fedprox}]"
    assert main(["sweep", *fast, "--grid", twice, "--out", str(tmp_path / "twice")]) == 0
    assert "each method at the methods its validation chose" in capsys.readouterr().out
    assert list(hetfed.open_sweep(tmp_path / "twice").tuned()["method"]) == ["prox"]
