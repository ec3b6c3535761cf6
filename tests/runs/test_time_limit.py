"""``train.time_limit``: a run's rounds stop once they have taken that long, and the run ends as an early stop does
— its last round evaluated, its personalisation and summary written — so a fixed budget of machine time gives whole
runs (the PFLlib protocol's methods within one GPU session, FedBABU's fine-tuned row included)."""

from __future__ import annotations

import csv
import json
import re
import time
import types
from pathlib import Path

import pytest

from hetfed.cli import main
from hetfed.executors import updates

FAST = ["--set", "partition.clients=4", "--set", "train.local_steps=2", "--set", "heterogeneity.iid_draws=0",
        "--quiet"]
LOUD = FAST[:-1]  # the table and the lines below it printed


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


@pytest.fixture
def ten_seconds_a_round(monkeypatch):
    """The rounds' clock, as ``after_update`` reads it, says every round took 10 s more than it did."""
    monkeypatch.setattr(updates, "time", types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + 10.0))


def test_the_rounds_stop_after_the_first_that_ends_past_the_limit_evaluated_as_a_run_of_that_length(
        tmp_path, capsys, ten_seconds_a_round):
    """At 10 s a round, a limit of 35 s ends a 50-round run after round 4; its numbers are a 4-round run's."""
    limited, whole = tmp_path / "limited", tmp_path / "whole"
    assert main(["run", "--methods", "relu", *LOUD, "--set", "train.rounds=50", "--set", "train.time_limit=35",
                 "--out", str(limited)]) == 0
    line = "stopped (relu) after 4 rounds: its rounds reached train.time_limit"
    assert line in capsys.readouterr().out
    assert main(["report", str(limited)]) == 0 and line in (limited / "report.html").read_text()
    assert main(["run", "--methods", "relu", *FAST, "--set", "train.rounds=4", "--out", str(whole)]) == 0
    got, want = _summary(limited)["methods"]["relu"], _summary(whole)["methods"]["relu"]
    assert (got["rounds"], got["stopped_at_time_limit"], got["stopped_early"]) == (4, True, False)
    assert "stopped_at_time_limit" not in want
    assert got["final"] == want["final"] and got["best"] == want["best"] and got["best_round"] == want["best_round"]
    with open(limited / "metrics.csv") as f:
        rounds = {int(r["round"]) for r in csv.DictReader(f) if r["split"] != "train"}
    assert max(rounds) == 4  # the last round run was evaluated


def test_a_limit_the_rounds_never_reach_changes_nothing(tmp_path):
    limited, whole = tmp_path / "limited", tmp_path / "whole"
    assert main(["run", "--methods", "relu", *FAST, "--set", "train.rounds=3", "--set", "train.time_limit=1e6",
                 "--out", str(limited)]) == 0
    assert main(["run", "--methods", "relu", *FAST, "--set", "train.rounds=3", "--out", str(whole)]) == 0
    got, want = _summary(limited)["methods"]["relu"], _summary(whole)["methods"]["relu"]
    assert "stopped_at_time_limit" not in got and got["final"] == want["final"] and got["rounds"] == 3


def test_a_method_personalised_after_its_rounds_is_personalised_when_the_limit_ends_them(tmp_path):
    """FedBABU's fine-tuned row, what PFLlib reports, is there when the time limit ends the rounds (a run stopped
    by SIGTERM has none): after round 1 of 50 here, with the numbers of a 1-round run."""
    babu = ["--set", "methods=[{algorithm: fedbabu, params: {finetune_epochs: 1}}]"]
    limited, whole = tmp_path / "limited", tmp_path / "whole"
    assert main(["run", *babu, *FAST, "--set", "train.rounds=50", "--set", "train.time_limit=1e-9",
                 "--out", str(limited)]) == 0
    assert main(["run", *babu, *FAST, "--set", "train.rounds=1", "--out", str(whole)]) == 0
    got, want = _summary(limited)["methods"], _summary(whole)["methods"]
    assert got["fedbabu"]["rounds"] == 1 and got["fedbabu"]["stopped_at_time_limit"]
    assert got["fedbabu_ft"]["final"] == want["fedbabu_ft"]["final"]


def test_a_stacked_sweeps_runs_each_stop_at_the_limit_with_the_numbers_of_runs_that_long(tmp_path, capsys):
    """Each run of a stacked sweep keeps its own clock: at a limit any round passes, every run stops after round 1,
    and runs.csv (which now holds the rounds each method ran) is that of a 1-round sweep. The printed table shows
    the rounds the methods ran when a run stopped early, and only then."""
    sweep = ["sweep", "--methods", "relu", *LOUD, "--seeds", "2", "--stack", "--no-report"]
    limited, whole = tmp_path / "limited", tmp_path / "whole"
    assert main([*sweep, "--set", "train.rounds=30", "--set", "train.time_limit=1e-9", "--out", str(limited)]) == 0
    assert re.search(r"relu │ +rounds │ 1\.0000", capsys.readouterr().out)
    assert main([*sweep, "--set", "train.rounds=1", "--out", str(whole)]) == 0
    assert " rounds │" not in capsys.readouterr().out
    rows = [(limited / "runs.csv").read_text().splitlines(), (whole / "runs.csv").read_text().splitlines()]
    timing = ("seconds_per_round", "server_seconds_per_round")
    got, want = ([r for r in rs if not r.split(",")[-2].endswith(timing)] for rs in rows)
    assert got == want and "0,relu,rounds,1.0" in got


def test_a_limit_that_is_not_a_positive_number_of_seconds_is_refused(tmp_path, capsys):
    assert main(["run", "--set", "train.time_limit=0", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "train.time_limit" in err and not (tmp_path / "r").exists()


def test_a_stacked_sweeps_eta_is_what_is_left_of_the_time_limit_when_that_comes_first():
    """A stacked sweep's progress line: the ETA of the rounds left, or of the time limit's seconds left when fewer
    (the protocol's 2 000 rounds in a budget of minutes said hours)."""
    from hetfed.runs.sweep import SweepProgress

    limited = SweepProgress(3, 0, None, stacked=True, time_limit=60.0)
    limited.stacked_round(10, 2000)
    limited.method_t0 -= 10.0  # ten rounds took ten seconds: 1 990 left, ~33 minutes
    assert limited._rounds_eta() in ("ETA 1m00s (train.time_limit)", "ETA 0m59s (train.time_limit)")
    limited.rounds_from -= 30.0  # half the limit gone
    assert limited._rounds_eta() in ("ETA 0m30s (train.time_limit)", "ETA 0m29s (train.time_limit)")
    limited.stacked_round(1, 2000)  # the runs' next method: its own clock
    limited.method_t0 -= 10.0
    assert limited._rounds_eta() in ("ETA 1m00s (train.time_limit)", "ETA 0m59s (train.time_limit)")
    plain = SweepProgress(3, 0, None, stacked=True)
    plain.stacked_round(10, 2000)
    plain.method_t0 -= 10.0
    assert plain._rounds_eta() in ("ETA 33m10s", "ETA 33m11s")


def test_a_stacked_sweeps_eta_for_its_next_method_is_from_that_methods_rounds():
    """The second method's ETA came from the whole sweep's time (the first method's rounds included) over the
    second's rounds: ten minutes of a first method made ten rounds of the next look a minute each."""
    from hetfed.runs.sweep import SweepProgress

    progress = SweepProgress(3, 0, None, stacked=True)
    progress.stacked_round(2000, 2000)
    progress.t0 -= 600.0  # the first method's 2 000 rounds: ten minutes
    progress.method_t0 -= 600.0
    progress.stacked_round(10, 100)  # the next method, ten rounds in, a second each
    progress.method_t0 -= 10.0
    assert progress._rounds_eta() in ("ETA 1m30s", "ETA 1m31s")


def test_a_stacked_sweep_says_how_many_runs_are_ready_while_the_others_prepare(monkeypatch):
    """Its runs prepare their clients in turn before their first round (minutes on a large dataset): a line at most
    every ten seconds says how many are ready; none in the first ten seconds, none without a console."""
    import io

    from hetfed.console import make_console
    from hetfed.runs.sweep import SweepProgress

    console = make_console()
    console.file = out = io.StringIO()
    progress = SweepProgress(20, 0, console, stacked=True)
    progress.stacked_ready(3, 20)
    assert out.getvalue() == ""
    progress._shown -= 10.0
    progress.stacked_ready(4, 20)
    assert "[stacked, 20 runs: 4 ready for their rounds, which start when every run is]" in out.getvalue()
    progress.stacked_ready(5, 20)
    assert "5 ready" not in out.getvalue()
    SweepProgress(20, 0, None, stacked=True).stacked_ready(5, 20)  # no console: nothing, no error
    measuring = SweepProgress(20, 0, console, stacked=True, measures_gamma=True)  # runs that measure Γ first
    measuring._shown -= 10.0
    measuring.stacked_ready(6, 20)
    assert ("6 ready for their rounds, which start when every run is; each measures Γ first: --set "
            "heterogeneity.gamma=false leaves it out]") in out.getvalue()
