"""``heterogeneity.gamma: false``: a run (or every run of a sweep) that does not measure Γ — on 784 features it took
~30 s a run before the first round — keeps the label-skew figures, trains the same numbers, and says Γ was not
measured wherever Γ is shown; the Γ settings it then does not read are noted, and on Flower no client is asked for
its Γ summary."""

from __future__ import annotations

import csv
import json
import re

import numpy as np
import pytest

import hetfed.heterogeneity
from hetfed.cli import main
from hetfed.config import UnreadKey, load_config, unread_keys
from hetfed.heterogeneity import gamma_line, measure


def _clients(seed: int = 0):
    rng = np.random.default_rng(seed)
    x, y = rng.normal(size=(300, 4)), rng.integers(0, 3, 300)
    return x, y, np.array_split(rng.permutation(300), 3)


def test_without_features_only_the_label_figures_are_measured_and_they_are_the_full_measures(monkeypatch):
    x, y, clients = _clients()
    full = measure(x, y, clients, 3, iid_draws=2, seed=1)
    monkeypatch.setattr(hetfed.heterogeneity, "gamma", lambda *a, **k: pytest.fail("measured Γ"))
    monkeypatch.setattr(hetfed.heterogeneity, "gamma_iid", lambda *a, **k: pytest.fail("measured Γ_IID"))
    monkeypatch.setattr(hetfed.heterogeneity, "gamma_given_label", lambda *a, **k: pytest.fail("measured Γ(x|y)"))
    labels = measure(x, y, clients, 3, iid_draws=2, seed=1, of_features=False)
    assert (labels.label_emd, labels.label_emd_mean, labels.js_mean, labels.class_counts) == (
        full.label_emd, full.label_emd_mean, full.js_mean, full.class_counts)
    d = labels.as_dict()
    assert d["gamma_measured"] is False and full.as_dict()["gamma_measured"] is True
    assert all(d[k] is None for k in ("gamma", "gamma_iid", "gamma_excess", "gamma_given_label"))
    json.dumps(d, allow_nan=False)  # valid JSON: not measured is null, never NaN
    assert gamma_line(d) == "Γ = —   (not measured: heterogeneity.gamma = false)"


def test_a_run_without_gamma_trains_the_same_numbers_and_says_gamma_was_not_measured(tmp_path, capsys):
    common = ["--set", "train.rounds=2", "--quiet", "--no-report"]
    assert main(["run", *common, "--out", str(tmp_path / "with")]) == 0
    assert main(["run", *common, "--set", "heterogeneity.gamma=false", "--out", str(tmp_path / "without")]) == 0
    summary = json.loads((tmp_path / "without" / "summary.json").read_text(), parse_constant=pytest.fail)
    measured = json.loads((tmp_path / "with" / "summary.json").read_text())
    assert summary["gamma"] is None and summary["heterogeneity"]["gamma_measured"] is False
    assert measured["gamma"] > 0 and summary["heterogeneity"]["label_emd"] == measured["heterogeneity"]["label_emd"]
    assert (tmp_path / "without" / "metrics.csv").read_text() == (tmp_path / "with" / "metrics.csv").read_text()
    capsys.readouterr()
    assert main(["partition", "--set", "heterogeneity.gamma=false"]) == 0
    out = capsys.readouterr().out
    assert "not measured: heterogeneity.gamma = false" in out and "label EMD mean" in out


def test_a_sweep_without_gamma_has_no_gamma_rows(tmp_path):
    assert main(["sweep", "--seeds", "2", "--stack", "--no-report", "--set", "train.rounds=1", "--set",
                 "heterogeneity.gamma=false", "--out", str(tmp_path / "s")]) == 0
    with open(tmp_path / "s" / "runs.csv") as fh:
        data = {r["metric"] for r in csv.DictReader(fh) if r["method"] == "(data)"}
    assert data == {"label_emd_mean"}


def test_the_gamma_settings_it_does_not_read_are_noted_and_no_flower_client_is_asked_for_a_summary():
    with pytest.warns(UnreadKey):  # the notes a command prints
        sets = ["heterogeneity.gamma=false", "heterogeneity.iid_draws=5", "heterogeneity.given_label=false",
                "train.executor=flower", "flower.summary_clip=1"]
        config = load_config(None, sets)
    notes = unread_keys(config)
    assert {"heterogeneity.iid_draws", "heterogeneity.given_label", "flower.summary_clip"} <= set(notes)
    assert "heterogeneity.gamma = false" in notes["heterogeneity.iid_draws"]
    assert not unread_keys(load_config(None, ["heterogeneity.iid_draws=5"]))

    from hetfed.flower.discovery import gamma_of
    from hetfed.flower.executor import FlowerExecutor

    assert gamma_of(config, []).gamma_measured is False
    assert FlowerExecutor(None, config, 0).asks_summaries is False  # type: ignore[arg-type]
    measured = load_config(None, ["train.executor=flower"])
    assert FlowerExecutor(None, measured, 0).asks_summaries is True  # type: ignore[arg-type]


def test_a_slow_gamma_says_how_to_leave_it_out(monkeypatch, capsys):
    import hetfed.pipeline

    monkeypatch.setattr(hetfed.pipeline, "SAY_SKIP_AFTER_S", 0.0)  # Γ of Fashion-MNIST's pixels: ~20 s on 2 cores
    assert main(["partition", "--set", "heterogeneity.iid_draws=0"]) == 0
    assert "--set heterogeneity.gamma=false leaves it out" in capsys.readouterr().err
    assert main(["partition", "--set", "heterogeneity.gamma=false"]) == 0
    assert "leaves it out" not in capsys.readouterr().err


def test_a_slow_gamma_given_label_says_it_can_be_left_out_alone(monkeypatch, capsys):
    """Γ(x|y) with its reference re-deals every class among its holders: on Fashion-MNIST it was 17 of Γ's 26 s.
    Where it is most of Γ's time, the hint names ``heterogeneity.given_label=false`` and its seconds."""
    import time

    import hetfed.heterogeneity
    import hetfed.pipeline

    measured = hetfed.heterogeneity.gamma_given_label

    def slow(*args, **kwargs):
        time.sleep(1.0)
        return measured(*args, **kwargs)

    monkeypatch.setattr(hetfed.pipeline, "SAY_SKIP_AFTER_S", 0.0)
    monkeypatch.setattr(hetfed.heterogeneity, "gamma_given_label", slow)
    assert main(["partition", "--set", "heterogeneity.iid_draws=0"]) == 0
    assert re.search(r"leaves it out \(heterogeneity.given_label=false: Γ\(x\|y\) alone, \d+ s of them\)$",
                     capsys.readouterr().err, re.MULTILINE)
    assert main(["partition", "--set", "heterogeneity.iid_draws=0", "--set", "heterogeneity.given_label=false"]) == 0
    err = capsys.readouterr().err
    assert "leaves it out" in err and "given_label=false" not in err
