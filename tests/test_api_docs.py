"""Every Python example in docs/api.md runs, in order, as a user would paste it (the docs stay true)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

#: every test here looks at what a run draws or prints while drawing (conftest skips drawing elsewhere)
pytestmark = pytest.mark.draws

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "api.md"


def examples() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_the_docs_have_the_examples_the_issue_asks_for():
    text = DOC.read_text()
    for heading in ("Build a partition and look at Γ", "Compare two methods", "Reload a run and predict"):
        assert f"## {heading}" in text
    assert len(examples()) >= 5


@pytest.mark.slow
def test_every_example_in_docs_api_md_runs(tmp_path, monkeypatch):
    (tmp_path / "configs").symlink_to(ROOT / "configs")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__docs__"}
    for i, code in enumerate(examples()):
        try:
            exec(compile(code, f"docs/api.md example {i + 1}", "exec"), namespace)
        except Exception as err:  # say which example broke
            raise AssertionError(f"docs/api.md example {i + 1} failed: {type(err).__name__}: {err}\n{code}") from err
    assert (tmp_path / "runs" / "compare" / "report.html").is_file()
    assert (tmp_path / "runs" / "sweep" / "report.html").is_file()
    assert (tmp_path / "clients.png").is_file() and (tmp_path / "clients.svg").is_file()


def test_import_hetfed_is_fast_and_lazy():
    """``import hetfed`` pulls in neither torch nor matplotlib nor the extractors; the API not until used."""
    code = ("import sys, time; t = time.perf_counter(); import hetfed; dt = time.perf_counter() - t; "
            "heavy = [m for m in ('torch', 'matplotlib', 'hetfed.api', 'hetfed.data.extractors', 'pandas') "
            "if m in sys.modules]; "
            "hetfed.load_config; api_heavy = [m for m in ('torch', 'matplotlib', 'hetfed.data.extractors') "
            "if m in sys.modules]; print(dt, heavy, api_heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split(" ", 1)
    assert out[1].strip() == "[] []", out
    assert float(out[0]) < 1.0  # generous: it is ~10 ms; the point is that nothing heavy is imported


def test_api_errors_name_the_key_and_what_is_allowed(tmp_path):
    import hetfed

    with pytest.raises(hetfed.ConfigError, match="train.rounds"):
        hetfed.load_config(overrides={"train.rounds": -1})
    with pytest.raises(hetfed.ConfigError, match="expected a dict"):
        hetfed.sweep(None, {"partition.shuffle": 0.5})
    with pytest.raises(hetfed.RunError, match="not a run directory"):
        hetfed.open_run(tmp_path)
    with pytest.raises(hetfed.RunError, match="not a sweep directory"):
        hetfed.open_sweep(tmp_path)
