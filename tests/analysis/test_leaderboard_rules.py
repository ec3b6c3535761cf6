"""The leaderboard's three reporting rules (#48 §4): PFLlib's (the best test accuracy over rounds), the best round
by validation and the last round, read from a run's own files by results/tables.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tables():
    spec = importlib.util.spec_from_file_location("tables", ROOT / "results" / "tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    return tables


def test_pfllibs_rule_is_the_best_weighted_test_accuracy_over_the_evaluated_rounds(tmp_path):
    run = tmp_path / "seed=0"
    run.mkdir()
    rows = ["method,round,split,client,metric,value",
            "a,5,summary,all,local_accuracy_weighted,0.70", "a,10,summary,all,local_accuracy_weighted,0.82",
            "a,15,summary,all,local_accuracy_weighted,0.79", "a,10,summary,3,local_accuracy_weighted,0.99",
            "a,10,summary,all,local_accuracy_mean,0.95", "b,5,summary,all,local_accuracy_weighted,0.60"]
    (run / "metrics.csv").write_text("\n".join(rows) + "\n")
    assert _tables().pfllib_rule(run) == {"a": 0.82, "b": 0.60}  # the 'all' rows of the weighted accuracy only


def test_the_leaderboard_table_reports_all_three_rules(tmp_path):
    from hetfed.cli import main

    out = tmp_path / "sweep"
    assert main(["sweep", str(ROOT / "configs" / "default.yaml"), "--seeds", "2", "--out", str(out), "--quiet",
                 "--set", "train.rounds=4",
                 "--set", "train.eval_every=2", "--set", "partition.clients=4",
                 "--set", "methods=[{name: ditto, algorithm: ditto}]"]) == 0
    text = _tables().leaderboard_table(out)
    header = next(ln for ln in text.splitlines() if ln.startswith("| method"))
    assert "personal (weighted) best" in header and "personal (weighted) last" in header and "PFLlib's rule" in header
    row = next(ln for ln in text.splitlines() if ln.startswith("| ditto |")).split("|")
    runs = json.loads((out / "sweep.json").read_text())["runs"]
    best = [_tables().pfllib_rule(Path(r["run_dir"]))["ditto"] for r in runs]
    assert row[-2].strip().startswith(f"{sum(best) / 2:.3f}")
