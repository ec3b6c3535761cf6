"""A sweep's learning curves: curves.csv keeps every run's summary rows of :data:`CURVES`, and what the sweep's
figures and report draw is read back from it (each run's metrics.csv is read once, by :func:`write_curves`)."""

from __future__ import annotations

import csv

from hetfed.runs.rundir import METRIC_COLUMNS
from hetfed.runs.sweep_tables import CURVES, read_curves_table, write_curves


def _metrics(path, rows):
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows([METRIC_COLUMNS, *rows])


def test_curves_csv_keeps_the_summary_rows_and_reads_back_per_seed(tmp_path):
    runs = []
    for seed in (0, 1):
        run = tmp_path / f"seed={seed}"
        run.mkdir()
        rows = []
        for r in (1, 2, 3):
            rows += [["fed,avg", r, "summary", "all", "global_accuracy", 0.1 * r + seed],
                     ["fed,avg", r, "client", "3", "global_accuracy", 9.0],  # a client's row: not a curve
                     ["fed,avg", r, "summary", "all", "train_loss", 1.0],  # not one of CURVES
                     ["fed,avg", r, "train", "all", "summary", 7.0]]  # "summary" as a metric name, not a split
        rows.append(["fed,avg", 3, "summary", "all", "global_accuracy", 5.0])  # a repeated round: first wins
        rows.append(["other", 1, "summary", "all", "val_loss", 0.5])  # one point: no curve
        _metrics(run / "metrics.csv", rows)
        runs.append(({"train.lr": 0.1, "flag": True}, seed, run))
    write_curves(tmp_path / "curves.csv", runs, ["train.lr", "flag"])
    with open(tmp_path / "curves.csv", newline="") as fh:
        table = list(csv.reader(fh))
    assert table[0] == ["train.lr", "flag", "seed", "method", "round", "metric", "value"]
    assert {row[5] for row in table[1:]} <= set(CURVES) and len(table) == 1 + 2 * (3 + 1 + 1)
    curves = read_curves_table(tmp_path / "curves.csv")
    assert set(curves) == {"global_accuracy"}
    (point, seeds), = curves["global_accuracy"]["fed,avg"].items()
    assert point == "train.lr=0.1,flag=True"
    assert seeds == [[(1, 0.1), (2, 0.2), (3, 0.1 * 3)], [(1, 1.1), (2, 1.2), (3, 0.1 * 3 + 1)]]
    assert read_curves_table(tmp_path / "absent.csv") == {}
