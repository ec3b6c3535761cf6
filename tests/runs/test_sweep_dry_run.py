"""``hetfed sweep --dry-run``: a sweep checked as it is before it runs, its runs listed with what it would do with
each, nothing trained or written — and what it says is what the sweep then does."""

import json
from pathlib import Path

import pytest

from hetfed.cli import main

REPO = Path(__file__).resolve().parents[2]
SWEEP = ["sweep", str(REPO / "configs" / "default.yaml"), "--set", "train.rounds=2", "--set", "partition.clients=4",
         "--grid", "partition.shuffle=0,1", "--each-method"]


def _listed(out: str) -> dict[str, str]:
    """The dry run's lines: each run's folder → its fate."""
    return dict(line.split(maxsplit=1) for line in out.splitlines() if line and not line.startswith("dry run:"))


def test_a_dry_run_lists_every_run_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main([*SWEEP, "--seeds", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert _listed(out) == {f"partition.shuffle={s}/seed={seed}/method={m}": "train"
                            for s in (0, 1) for seed in (0, 1) for m in ("relu", "cgau")}
    assert "dry run: 8 runs (8 to train; one at a time) in a new folder in runs/" in out
    assert not list(tmp_path.iterdir())  # no runs/ folder, nothing else
    assert main([*SWEEP, "--seeds", "2", "--dry-run", "--quiet", "--stack"]) == 0
    assert capsys.readouterr().out.startswith("dry run: 8 runs (8 to train; stacked)")


def test_a_resumed_dry_run_says_what_the_sweep_then_does(tmp_path, monkeypatch, capsys):
    sweep = tmp_path / "s"
    assert main([*SWEEP, "--seeds", "1", "--out", str(sweep), "--quiet", "--no-report"]) == 0
    broken = sweep / "partition.shuffle=1" / "seed=0" / "method=cgau"
    (broken / "summary.json").unlink()  # as if killed before its checkpoint
    kept = (sweep / "partition.shuffle=0" / "seed=0" / "method=relu" / "summary.json").read_text()
    capsys.readouterr()
    before = sorted(p.relative_to(sweep) for p in sweep.rglob("*"))
    assert main([*SWEEP, "--seeds", "2", "--out", str(sweep), "--resume", "--dry-run"]) == 0
    fates = _listed(capsys.readouterr().out)
    assert sorted(p.relative_to(sweep) for p in sweep.rglob("*")) == before  # nothing written or moved
    assert fates["partition.shuffle=1/seed=0/method=cgau"] == "redo"
    assert [folder for folder, fate in fates.items() if fate == "reuse"] == [
        "partition.shuffle=0/seed=0/method=relu", "partition.shuffle=0/seed=0/method=cgau",
        "partition.shuffle=1/seed=0/method=relu"]
    assert sum(fate == "train" for fate in fates.values()) == 4  # the second seed's
    assert main([*SWEEP, "--seeds", "2", "--out", str(sweep), "--resume", "--quiet", "--no-report"]) == 0
    assert (sweep / "partition.shuffle=0" / "seed=0" / "method=relu" / "summary.json").read_text() == kept  # reused
    assert (broken.with_name("method=cgau.incomplete-1")).is_dir() and (broken / "summary.json").is_file()  # redone
    runs = json.loads((sweep / "sweep.json").read_text())["runs"]
    assert len(runs) == 8
    from hetfed import pipeline  # resumed once more, every run reused: its tables again, and no data loaded

    monkeypatch.setattr(pipeline, "load_dataset", lambda *a: pytest.fail("a finished sweep resumed loaded its data"))
    assert main([*SWEEP, "--seeds", "2", "--out", str(sweep), "--resume", "--dry-run", "--quiet"]) == 0
    assert "dry run: 8 runs (8 to reuse; one at a time)" in capsys.readouterr().out
    assert main([*SWEEP, "--seeds", "2", "--out", str(sweep), "--resume", "--quiet", "--no-report"]) == 0
    assert json.loads((sweep / "sweep.json").read_text())["runs"] == runs


def test_a_dry_run_plans_every_run_and_names_those_the_sweep_would_record_failed(tmp_path, capsys):
    """A point whose partition cannot be made (``min_size`` above any client's share) is one the sweep runs to
    its failure and records in sweep.json; the dry run says so for each of its runs, with the reason."""
    config = tmp_path / "c.yaml"
    config.write_text("train:\n  rounds: 2\npartition:\n  kind: dirichlet\n  clients: 4\n")
    assert main(["sweep", str(config), "--grid", "partition.min_size=5,2000", "--seeds", "2", "--dry-run",
                 "--quiet"]) == 0
    out = capsys.readouterr().out
    refused = _listed(out)  # --quiet: the refused runs alone
    assert set(refused) == {"partition.min_size=2000/seed=0", "partition.min_size=2000/seed=1"}, out
    assert all(fate.startswith("refused: partition.min_size = 2000 is not allowed") for fate in refused.values())
    assert "dry run: 4 runs (2 to train, 2 refused; one at a time)" in out


def test_a_dry_run_refuses_what_the_sweep_refuses_before_loading_what_it_need_not(tmp_path, monkeypatch, capsys):
    """kNN-Per on a logistic regression: refused by the plan (a check on the data), one line, exit 2; a non-empty
    ``--out``: refused before any data are loaded (the sweep's own check, now with its arguments)."""
    config = tmp_path / "c.yaml"
    config.write_text("model:\n  kind: logreg\nmethods:\n  - algorithm: knnper\ntrain:\n  rounds: 2\n")
    assert main(["sweep", str(config), "--dry-run", "--out", str(tmp_path / "s")]) == 2
    err = capsys.readouterr().err.splitlines()  # the loading's lines, then the one-line error
    assert err[-1].startswith("error: methods.0.algorithm = 'knnper' is not allowed"), err
    assert not (tmp_path / "s").exists()
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")

    def never(*_args):
        raise AssertionError("the data were loaded")

    monkeypatch.setattr("hetfed.pipeline.load_dataset", never)
    for dry in ([], ["--dry-run"]):
        assert main([*SWEEP, "--out", str(tmp_path / "full"), *dry]) == 2
        assert "already exists and is not empty" in capsys.readouterr().err


def test_a_grid_key_with_no_value_is_refused_by_the_sweep_and_its_dry_run(tmp_path):
    """``hetfed.sweep`` with ``{"partition.shuffle": []}`` made a sweep of no runs: a folder of empty tables and
    "every run of the sweep failed"; its dry run met an IndexError."""
    from hetfed.config import load_config
    from hetfed.errors import ConfigError
    from hetfed.runs.sweep import dry_run, run_sweep

    config = load_config(None, [])
    with pytest.raises(ConfigError, match=r"grid partition.shuffle = \[\] is not allowed: expected one value or more"):
        dry_run(config, {"partition.shuffle": []}, seeds=1)
    with pytest.raises(ConfigError, match="grid partition.shuffle"):
        run_sweep(config, {"partition.shuffle": []}, seeds=1, out=tmp_path / "s", progress=False)
    assert not (tmp_path / "s").exists()


def test_the_api_dry_run_gives_the_command_lines_fates_as_a_table(tmp_path):
    """``hetfed.sweep_dry_run``: the dry run from Python — the same runs and fates, nothing written; a bad grid and
    a bad switch refused in one line, as :func:`hetfed.sweep` refuses them."""
    import hetfed

    config = tmp_path / "c.yaml"
    config.write_text("train:\n  rounds: 2\npartition:\n  kind: dirichlet\n  clients: 4\n")
    table = hetfed.sweep_dry_run(str(config), {"partition.min_size": [5, 2000]}, seeds=2, out=tmp_path / "s")
    assert list(table.columns) == ["run", "fate"]
    assert list(table["run"]) == ["partition.min_size=5/seed=0", "partition.min_size=5/seed=1",
                                  "partition.min_size=2000/seed=0", "partition.min_size=2000/seed=1"]
    assert list(table["fate"][:2]) == ["train", "train"]
    assert all(fate.startswith("refused: partition.min_size = 2000 is not allowed") for fate in table["fate"][2:])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml"]
    with pytest.raises(hetfed.ConfigError, match=r"grid partition.min_size = \[\] is not allowed: expected one value"):
        hetfed.sweep_dry_run(str(config), {"partition.min_size": []})
    with pytest.raises(hetfed.ConfigError, match="expected a dict of key → list of values"):
        hetfed.sweep_dry_run(str(config), {"partition.min_size": 5})  # type: ignore[dict-item]
    with pytest.raises(hetfed.ConfigError, match="stack='yes' is not allowed: expected True or False"):
        hetfed.sweep_dry_run(str(config), {"partition.min_size": [5]}, stack="yes")  # type: ignore[arg-type]
