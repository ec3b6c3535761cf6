"""The leaderboard's three reporting rules (#48 §4): PFLlib's (the best test accuracy over rounds), the best round
by validation and the last round, read from a run's own files by results/tables.py."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

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


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """A small sweep of three methods and two seeds: what PFLlib publishes (Ditto; FedBABU, whose two views each
    report their own rows) and what it does not (``local``)."""
    from hetfed.cli import main

    out = tmp_path_factory.mktemp("leaderboard") / "sweep"
    assert main(["sweep", str(ROOT / "configs" / "default.yaml"), "--seeds", "2", "--out", str(out), "--quiet",
                 "--set", "train.rounds=4",
                 "--set", "train.eval_every=2", "--set", "partition.clients=4",
                 "--set", "methods=[{name: ditto, algorithm: ditto}, {name: alone, algorithm: local}, "
                 "{name: babu, algorithm: fedbabu}]"]) == 0
    return out


def test_the_leaderboard_table_reports_all_three_rules(sweep):
    out = sweep
    text = _tables().leaderboard_table(out)
    header = next(ln for ln in text.splitlines() if ln.startswith("| method"))
    assert "personal (weighted) best" in header and "personal (weighted) last" in header and "PFLlib's rule" in header
    row = next(ln for ln in text.splitlines() if ln.startswith("| ditto |")).split("|")
    runs = json.loads((out / "sweep.json").read_text())["runs"]
    best = [_tables().pfllib_rule(Path(r["run_dir"]))["ditto"] for r in runs]
    assert row[-2].strip().startswith(f"{sum(best) / 2:.3f}")


def test_every_published_pfllib_number_is_set_against_the_sweeps_own_runs_of_that_method(sweep):
    tables = _tables()
    published = json.loads(tables.PUBLISHED.read_text())
    assert published["source"]["commit"] and len(published["methods"]) == 20  # PFLlib's table, every row
    text = tables.pfllib_table(sweep)
    rows: dict[str, list[list[str]]] = {}
    for ln in text.splitlines():
        if ln.startswith("| ") and not ln.startswith("| PFLlib"):
            rows.setdefault(ln.split("|")[1].strip(), []).append([c.strip() for c in ln.split("|")[2:-1]])
    runs = json.loads((sweep / "sweep.json").read_text())["runs"]
    ours = np.array([100 * tables.pfllib_rule(Path(r["run_dir"]))["ditto"] for r in runs])
    [[method, value, pub, diff, verdict]] = rows["Ditto"]
    assert (method, pub) == ("ditto", "97.47 ± 0.04")
    assert value == f"{ours.mean():.2f} ± {ours.std():.2f} (2 seeds)"  # numpy's sd (ddof 0), as PFLlib prints it
    assert diff == f"{ours.mean() - 97.47:+.2f}"
    assert verdict == ("within 1 point" if abs(ours.mean() - 97.47) <= 1 else
                       "differs by more than 1 point: a finding")
    assert rows["FedALA"][0][-1] == "not run (hetfed's `fedala`)" and rows["FedAMP"][0][-1] == "not in hetfed"
    # both views, each set against PFLlib's FedBABU
    assert [r[0] for r in rows["FedBABU"]] == ["babu:fedbabu", "babu:fedbabu_ft"]
    assert [(r[0], r[-1]) for r in rows["—"]] == [("alone", "no published number")]  # Local: not in PFLlib's table
    assert "8afdf11d57fb" in text
