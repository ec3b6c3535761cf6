"""The leaderboard's three reporting rules (#48 §4): PFLlib's (the best test accuracy over rounds), the best round
by validation and the last round, read from a run's own files by results/tables.py."""

from __future__ import annotations

import importlib.util
import json
import time
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
    [[method, rounds, value, by_val, pub, diff, verdict]] = rows["Ditto"]
    assert (method, rounds, pub) == ("ditto", "4", "97.47 ± 0.04")
    assert value == f"{ours.mean():.2f} ± {ours.std():.2f} (2 seeds)"  # numpy's sd (ddof 0), as PFLlib prints it
    val = np.array([100 * tables.by_validation(Path(r["run_dir"]))["ditto"] for r in runs])
    assert by_val == f"{val.mean():.2f} ± {val.std():.2f}"
    assert diff == f"{ours.mean() - 97.47:+.2f}"
    assert verdict == "not comparable: 4 of the published 2000 rounds"  # 4 rounds: no verdict on the method
    assert rows["FedALA"][0][-1] == "not run (hetfed's `fedala`)" and rows["FedAMP"][0][-1] == "not in hetfed"
    # both views, each set against PFLlib's FedBABU
    assert [r[0] for r in rows["FedBABU"]] == ["babu:fedbabu", "babu:fedbabu_ft"]
    assert [r[1] for r in rows["FedBABU"]] == ["4", "4"]  # the fine-tuned models' rounds: the run's, not 5 epochs
    assert [(r[0], r[-1]) for r in rows["—"]] == [("alone", "no published number")]  # Local: not in PFLlib's table
    assert "8afdf11d57fb" in text


def test_a_published_number_that_measures_another_model_says_so_in_its_verdict_whatever_the_rounds(sweep, tmp_path):
    """PFLlib's pFedMe row scores its server's model (results/pfllib_code/): the published entry's caveat is in the
    row's verdict — run or not, at any rounds — and a run method's numbers are still set beside it."""
    tables = _tables()
    published = json.loads(tables.PUBLISHED.read_text())
    [pfedme] = [m for m in published["methods"] if m["pfllib"] == "pFedMe"]
    assert "server's model" in pfedme["caveat"] and "results/pfllib_code/" in pfedme["caveat"]
    assert [m["pfllib"] for m in published["methods"] if m.get("caveat")] == ["pFedMe"]

    def verdicts(text: str) -> dict[str, str]:
        return {ln.split("|")[1].strip(): ln.split("|")[-2].strip() for ln in text.splitlines()
                if ln.startswith("| ") and not ln.startswith("| PFLlib")}

    assert verdicts(tables.pfllib_table(sweep))["pFedMe"] == f"not run (hetfed's `pfedme`); {pfedme['caveat']}"
    for m in published["methods"]:  # the same caveat on a method the sweep ran
        if m["pfllib"] == "Ditto":
            m["caveat"] = "measures another model"
    (tmp_path / "published.json").write_text(json.dumps(published))
    text = tables.pfllib_table(sweep, tmp_path / "published.json")
    assert verdicts(text)["Ditto"] == "not comparable: 4 of the published 2000 rounds; measures another model"
    assert verdicts(text)["Ditto"].startswith(verdicts(tables.pfllib_table(sweep))["Ditto"])


def test_the_round_chosen_by_validation_is_the_lowest_validation_loss_and_its_accuracy_is_reported(tmp_path):
    run = tmp_path / "seed=0"
    run.mkdir()
    rows = ["method,round,split,client,metric,value"] + [
        f"a,{r},summary,all,{m},{v}" for r, loss, acc in ((1, 0.9, 0.5), (2, 0.4, 0.7), (3, 0.6, 0.9))
        for m, v in (("val_loss", loss), ("local_accuracy_weighted", acc))] + ["a,4,summary,all,val_loss,nan"]
    (run / "metrics.csv").write_text("\n".join(rows) + "\n")
    assert _tables().by_validation(run) == {"a": 0.7}  # round 2's, not the best test accuracy (round 3's)
    assert _tables().pfllib_rule(run) == {"a": 0.9}


def test_a_sweep_stopped_by_its_time_budget_is_read_up_to_each_runs_last_evaluation(tmp_path):
    """#74 §5: benchmarks/pfllib_protocol.sh stops its sweeps with SIGTERM after a budget; each run is read from its
    metrics.csv up to its last evaluation, the rounds it reached stated, and the comparison with a published number
    refused below the published rounds."""
    import subprocess
    import sys

    sweep = tmp_path / "sweep"
    args = [sys.executable, "-c", "import sys; from hetfed.cli import entry; sys.argv[0] = 'hetfed'; entry()", "sweep",
            str(ROOT / "configs" / "default.yaml"), "--seeds", "2", "--out", str(sweep), "--quiet", "--stack", "--set",
            "train.rounds=100000", "--set", "train.eval_every=1", "--set", "partition.clients=3", "--set",
            "train.checkpoint_every=null", "--set", "heterogeneity.iid_draws=0",
            "--grid", "methods=[{name: ditto, algorithm: ditto}],[{name: babu, algorithm: fedbabu}]"]
    with open(tmp_path / "log", "w") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not any(  # the runs step together: each has evaluated once
                "summary,all,local_accuracy_weighted" in f.read_text() for f in sweep.glob("*/seed=1/metrics.csv")):
            time.sleep(0.5)
        time.sleep(1)
        proc.terminate()
        assert proc.wait(60) == 143, (tmp_path / "log").read_text()  # as a sweep one run at a time: no sweep tables
    finally:
        if proc.poll() is None:  # never leave a 100 000-round sweep behind
            proc.kill()
            proc.wait()
    statuses = {p.parent: json.loads(p.read_text()) for p in sweep.glob("*/seed=*/status.json")}
    assert len(statuses) == 4 and {s["reason"] for s in statuses.values()} == {"terminated by SIGTERM"}
    tables = _tables()
    text = tables.pfllib_table([sweep])
    cells = {ln.split("|")[2].strip(): [c.strip() for c in ln.split("|")[1:-1]] for ln in text.splitlines()
             if ln.startswith("| ") and not ln.startswith("| PFLlib")}
    runs = [run for run in statuses if "ditto" in run.parent.name]
    reached = [max(tables._evaluations(r)["ditto"]) for r in runs]
    ours = np.array([100 * tables.pfllib_rule(r)["ditto"] for r in runs])
    ditto = cells["ditto"]
    assert ditto[0] == "Ditto" and ditto[2] == str(min(reached)) and min(reached) >= 1
    assert ditto[3] == f"{ours.mean():.2f} ± {ours.std():.2f} (2 seeds)"
    assert ditto[-1] == f"not comparable: {min(reached)} of the published 2000 rounds"


def test_the_attack_table_shows_the_metric_asked_for_a_column_per_method_and_other_swept_point(tmp_path):
    """``results/tables.py attack --metric``: each attack's final values of the metric (or ``--best``: the round chosen
    by validation), one column per method and point of the other swept keys (a privacy grid beside the attack's); an
    attack named by its keys that differ from its kind's defaults."""
    runs = []
    for i, (attack, clip, acc, backdoor) in enumerate([({"kind": "backdoor", "fraction": 0.1}, 0.5, 0.9, 0.2),
                                                       ({"kind": "backdoor", "fraction": 0.1}, 0.5, 0.8, 0.4),
                                                       ({"kind": "backdoor", "fraction": 0.1}, 1.0, 0.95, 0.7)]):
        run = tmp_path / f"run{i}"
        run.mkdir()
        (run / "config.yaml").write_text(json.dumps({"attack": {**attack, "target": 3, "size": 3, "start_round": 1}}))
        final = {"global_accuracy": acc, "backdoor_accuracy": backdoor}
        best = {"global_accuracy": acc - 0.1}
        (run / "summary.json").write_text(json.dumps({"methods": {"mean": {"final": final, "best": best}}}))
        runs.append({"point": {"attack": attack, "privacy": {"clip": clip}}, "run_dir": str(run)})
    (tmp_path / "sweep.json").write_text(json.dumps({"runs": runs}))
    table = _tables().attack_table(tmp_path, "backdoor_accuracy")
    assert "| mean (privacy={'clip': 0.5}) | mean (privacy={'clip': 1.0}) |" in table
    assert "| backdoor (target 3) | 10% | 0.300 ± " in table and "| 0.700 (1 seed) |" in table
    assert "final backdoor_accuracy" in table
    assert "| 0.850 ± " in _tables().attack_table(tmp_path)  # the global accuracy by default
    best = _tables().attack_table(tmp_path, when="best")
    assert "| 0.750 ± " in best and "best-by-validation global_accuracy" in best


def test_the_attack_tables_defence_cells_are_the_shares_left_out_over_the_seeds(tmp_path):
    """``results/tables.py attack --defence``: each defence's mean shares of the malicious and of the honest updates it
    left out (from each run's summed counts) and of its weight on the malicious ones; "-" for a rule that weighs no
    update."""
    runs = []
    for seed, (bad_out, good_out) in enumerate([(3, 1), (1, 0)]):
        run = tmp_path / f"run{seed}"
        run.mkdir()
        (run / "config.yaml").write_text(json.dumps({"attack": {"kind": "alie", "fraction": 0.3}}))
        counts = {"attackers_sent": 4, "attackers_excluded": bad_out, "honest_sent": 10, "honest_excluded": good_out}
        methods = {"krum": {"final": {}, "best": {}, "clients": counts, "attack_weight": 0.2 * seed},
                   "median": {"final": {}, "best": {}, "clients": {"clients_sampled": 14}}}
        (run / "summary.json").write_text(json.dumps({"methods": methods}))
        runs.append({"point": {"attack": {"kind": "alie", "fraction": 0.3}}, "run_dir": str(run)})
    (tmp_path / "sweep.json").write_text(json.dumps({"runs": runs}))
    table = _tables().attack_table(tmp_path, defence=True)
    assert "| alie | 30% | 0.50 / 0.05 / 0.10 | - |" in table  # (3/4 + 1/4) / 2, (1/10 + 0) / 2, (0 + 0.2) / 2
