"""A run under attack shows, round by round, what its defence decided: the shares of the malicious and of the honest
updates it left out and the malicious updates' share of its weight — computed from metrics.csv's counts, drawn in
the run's report."""

from __future__ import annotations

import csv

import pytest

from hetfed.analysis.present import present_run
from hetfed.analysis.report import write_report
from hetfed.analysis.results import defence_curves, run_level
from hetfed.config import build_config
from hetfed.runs.runner import run_experiment

pytestmark = pytest.mark.draws


def _row(method: str, rnd: int, metric: str, value: float) -> dict:
    return {"method": method, "round": str(rnd), "split": "train", "client": "all", "metric": metric,
            "value": str(value)}


def test_the_defences_round_by_round_shares_are_its_counts_over_the_updates_sent():
    rows = [_row("krum", 1, "attackers_sent", 4), _row("krum", 1, "attackers_excluded", 3),
            _row("krum", 1, "honest_sent", 16), _row("krum", 1, "honest_excluded", 4),
            _row("krum", 1, "attack_weight", 0.25),
            _row("krum", 2, "attackers_sent", 0), _row("krum", 2, "attackers_excluded", 0),  # no attacker trained
            _row("krum", 2, "honest_sent", 20), _row("krum", 2, "honest_excluded", 19),
            _row("mean", 1, "train_loss", 0.5)]
    assert defence_curves(run_level(rows)) == {
        "defence.attackers_excluded": {"krum": [(1, 0.75)]},
        "defence.honest_excluded": {"krum": [(1, 0.25), (2, 0.95)]},
        "defence.attack_weight": {"krum": [(1, 0.25)]}}
    assert defence_curves(run_level([_row("mean", 1, "train_loss", 0.5)])) == {}


def test_a_run_under_attack_draws_what_its_defence_decided_and_a_plain_one_does_not(tmp_path):
    base = {"train": {"rounds": 3, "eval_every": 3},
            "methods": [{"name": "krum", "algorithm": "fedavg", "server": {"combine": {"rule": "krum"}}}]}
    attacked = tmp_path / "attacked"
    run_experiment(build_config({**base, "attack": {"kind": "sign_flip", "fraction": 0.3}}), out=attacked,
                   progress=False, present=present_run)
    with open(attacked / "metrics.csv", newline="") as fh:
        counts = {(r["round"], r["metric"]): float(r["value"]) for r in csv.DictReader(fh)
                  if r["metric"] in ("attackers_sent", "attackers_excluded")}
    assert counts[("1", "attackers_sent")] > 0
    page = write_report(attacked).read_text()
    section = page[page.index("<h2>what the defence decided</h2>"):]
    section = section[:section.index("</section>")]
    assert "<img" in section and "honest updates it left out" in section
    plain = tmp_path / "plain"
    run_experiment(build_config(base), out=plain, progress=False, present=present_run)
    assert "what the defence decided" not in write_report(plain).read_text()
