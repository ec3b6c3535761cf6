"""hetfed's ``HETFED_*`` process settings are applied or refused (:mod:`hetfed.environment`): a value that is not
allowed is never taken as the default, nor as "set"."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetfed import environment
from hetfed.errors import ConfigError
from hetfed.flower import worker


@given(st.text(st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)), max_size=8))
def test_a_switch_is_on_or_off_by_its_words_and_anything_else_is_refused_naming_it(text):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HETFED_X", text)
        word = text.strip().lower()
        if not word:
            assert environment.switch("HETFED_X", True) is True and environment.switch("HETFED_X", False) is False
        elif word in environment.ON + environment.OFF:
            assert environment.switch("HETFED_X", word in environment.OFF) is (word in environment.ON)
        else:
            with pytest.raises(ConfigError) as err:
                environment.switch("HETFED_X", True)
            assert str(err.value).startswith(f"HETFED_X = {text!r} is not allowed: expected one of 1, true")
            assert len(str(err.value).splitlines()) == 1


@pytest.mark.parametrize(("text", "integer", "expected"),
                         [("2", True, 2), (" 3 ", True, 3), ("", True, 7), ("0.5", False, 0.5), ("600", False, 600.0),
                          ("0", True, None), ("-1", True, None), ("1.5", True, None), ("two", True, None),
                          ("0", False, None), ("-0.5", False, None), ("nan", False, None), ("soon", False, None)])
def test_a_number_is_taken_above_zero_and_anything_else_is_refused_naming_it(monkeypatch, text, integer, expected):
    monkeypatch.setenv("HETFED_N", text)
    if expected is not None:
        assert environment.positive("HETFED_N", 7, integer=integer) == expected
        return
    with pytest.raises(ConfigError, match=f"^HETFED_N = {text!r} is not allowed: expected a "
                                          f"{'whole number' if integer else 'number'} above 0$"):
        environment.positive("HETFED_N", 7, integer=integer)


def test_a_flower_nodes_worker_settings_are_refused_not_taken_as_on(monkeypatch, tmp_path):
    """``HETFED_FLOWER_WORKER=maybe`` was taken as on, and a bad ``HETFED_WORKER_IDLE`` failed inside the worker,
    where only its log said so: both are refused in the ClientApp's process, before a worker starts."""
    monkeypatch.setenv("HETFED_FLOWER_WORKER", "maybe")
    with pytest.raises(ConfigError, match="HETFED_FLOWER_WORKER = 'maybe' is not allowed"):
        worker.enabled()
    monkeypatch.setenv("HETFED_FLOWER_WORKER", "off")
    assert worker.enabled() is False
    monkeypatch.setenv("HETFED_WORKER_IDLE", "ten minutes")
    with pytest.raises(ConfigError, match="HETFED_WORKER_IDLE = 'ten minutes' is not allowed"):
        worker._start(tmp_path / "socket", tmp_path / "w")
    assert not any(tmp_path.iterdir())  # no log, no pid: no worker started


@pytest.mark.parametrize("threads", ["0", "two", "1.5"])
def test_a_nodes_client_threads_that_are_not_a_count_are_refused_not_taken_as_one(monkeypatch, threads):
    from flwr.app import ConfigRecord

    from hetfed.config import build_config, dump_config
    from hetfed.flower.node import node_side

    monkeypatch.setenv("HETFED_CLIENT_THREADS", threads)
    cfg = build_config({"seed": 1234, "partition": {"clients": 3}, "methods": [{"algorithm": "fedavg"}]})
    with pytest.raises(ConfigError, match=f"HETFED_CLIENT_THREADS = '{threads}' is not allowed: expected a whole"):
        node_side(ConfigRecord({"config": dump_config(cfg), "method": 0}))


# ------------------------------------------------------------------ a variable hetfed does not read is refused

def test_every_variable_hetfed_reads_is_declared_and_a_mistyped_one_is_refused_with_the_one_it_meant(tmp_path,
                                                                                                   monkeypatch, capsys):
    import re
    from pathlib import Path

    from hetfed.cli import main
    from hetfed.environment import VARIABLES

    src = Path(__file__).resolve().parents[1] / "src" / "hetfed"
    read = {name for path in src.rglob("*.py") for name in re.findall(r"\bHETFED_[A-Z][A-Z_]*[A-Z]\b",
                                                                        path.read_text())}
    assert read - {"HETFED_TEST_"} <= set(VARIABLES), read - set(VARIABLES)  # the declaration cannot drift
    monkeypatch.setenv("HETFED_WORKER_IDEL", "5")
    assert main(["run", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith(
        "error: HETFED_WORKER_IDEL = '5' is not a variable hetfed reads: did you mean 'HETFED_WORKER_IDLE'? expected "
        "one of HETFED_CACHE,"), err
    assert not (tmp_path / "run").exists()  # refused before anything is written
    import hetfed

    with pytest.raises(ConfigError, match="HETFED_WORKER_IDEL = '5' is not a variable hetfed reads"):
        hetfed.run(None, out=tmp_path / "api")  # the Python API too
    assert not (tmp_path / "api").exists()
    monkeypatch.delenv("HETFED_WORKER_IDEL")
    monkeypatch.setenv("HETFED_TEST_ANYTHING", "1")  # the test suite's own: not hetfed's to refuse
    assert main(["config"]) == 0


def test_a_flower_node_refuses_a_mistyped_variable_in_its_step(monkeypatch):
    """A node's environment is its own (its SuperNode's): the ClientApp refuses there, so the step fails naming it."""
    pytest.importorskip("flwr")
    from hetfed.flower import lean_app

    monkeypatch.setenv("HETFED_FLOWER_WORKR", "0")
    with pytest.raises(ConfigError, match="HETFED_FLOWER_WORKR = '0' is not a variable hetfed reads: did you mean "
                                          "'HETFED_FLOWER_WORKER'?"):
        lean_app._handled("query", None, None)  # type: ignore[arg-type]
