"""When the round loop checkpoints (``train.checkpoint_every``): a number of rounds typed is applied exactly however
quick the rounds; the default, ``auto``, checkpoints every 10 rounds once a minute has passed since the last, so a
long run of quick rounds is not slowed by its checkpoints and a kill loses about a minute; every phase's end is
checkpointed whatever the setting."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetfed import config_train
from hetfed.cli import main
from hetfed.config import TrainConfig
from hetfed.config_train import AUTO_CHECKPOINT_ROUNDS, AUTO_CHECKPOINT_SECONDS, checkpoint_due
from hetfed.runs.checkpoint import Checkpointer


@given(st.integers(1, 500), st.floats(0, 1e4))
def test_a_typed_number_of_rounds_is_due_every_that_many_rounds_whatever_the_time(rnd, since):
    assert checkpoint_due(3, rnd, since) == (rnd % 3 == 0)
    assert not checkpoint_due(None, rnd, since)
    due = rnd % AUTO_CHECKPOINT_ROUNDS == 0 and since >= AUTO_CHECKPOINT_SECONDS
    assert checkpoint_due("auto", rnd, since) == due


def test_auto_is_the_default_and_a_setting_is_refused_in_one_line_naming_what_is_allowed(capsys):
    assert TrainConfig().checkpoint_every == "auto"
    assert TrainConfig(checkpoint_every=4).checkpoint_every == 4
    for value in ("0", "often", "2.5", "true"):
        assert main(["run", "--set", f"train.checkpoint_every={value}"]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "train.checkpoint_every" in err and "auto" in err and "null" in err


def _saved_rounds(monkeypatch, tmp_path, *sets: str) -> list[tuple[str, int | None]]:
    """The checkpoints a run of 25 quick rounds writes: (phase, round) each, the method's end as (done, None)."""
    saved: list[tuple[str, int | None]] = []
    save = Checkpointer.save

    def counted(self, current):
        saved.append(("done", None) if current is None else (current["phase"], current["result"].rounds_done))
        return save(self, current)

    monkeypatch.setattr(Checkpointer, "save", counted)
    out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    assert main(["run", "--quiet", "--set", "train.rounds=25", "--set", "methods=[{algorithm: fedavg}]",
                 "--set", "heterogeneity.gamma=false", *sets, "--out", str(out)]) == 0
    return saved


def test_auto_checkpoints_a_run_of_quick_rounds_only_at_its_end(monkeypatch, tmp_path):
    assert _saved_rounds(monkeypatch, tmp_path) == [("federated", 25), ("done", None)]


def test_auto_checkpoints_every_ten_rounds_once_its_time_has_passed(monkeypatch, tmp_path):
    monkeypatch.setattr(config_train, "AUTO_CHECKPOINT_SECONDS", 0.0)
    assert _saved_rounds(monkeypatch, tmp_path) == [("federated", 10), ("federated", 20), ("federated", 25),
                                                    ("done", None)]


@pytest.mark.parametrize("sets, rounds", [(("--set", "train.checkpoint_every=4"), [4, 8, 12, 16, 20, 24, 25]),
                                          (("--set", "train.checkpoint_every=null"), [25])])
def test_a_typed_cadence_is_applied_however_quick_the_rounds(monkeypatch, tmp_path, sets, rounds):
    assert _saved_rounds(monkeypatch, tmp_path, *sets) == [*(("federated", r) for r in rounds), ("done", None)]
