"""Every ``hetfed run | sweep | partition CONFIG --set …`` written in the README, the guides, the results' READMEs and
the configs' comments still resolves to a valid config.

Why: settings now belong to their components, and a key a component does not read is refused (the README's promise).
A result's command that a later change refuses no longer reproduces the result (a script's did:
``results/shakespeare/gamma.py`` passed ``partition.min_size``, Dirichlet's, to the roles' partitioner and exited
with status 2). A command is
checked as the CLI resolves it (:func:`hetfed.config.load_config` on its file and its ``--set`` overrides), without
running it. Commands that use shell variables or elide a value (``…``) are not checked.
"""

from __future__ import annotations

import re
import shlex
import warnings
from pathlib import Path

import pytest

from hetfed.config import load_config

REPO = Path(__file__).resolve().parents[1]
_COMMAND = re.compile(r"hetfed (?:run|sweep|partition) (\S+\.ya?ml)(.*)")


def documented_commands() -> list[tuple[str, str, list[str]]]:
    """``(where, config file, its --set overrides)`` of every documented command that names a config file of this
    repository (a shell line continued with ``\\`` read as one line)."""
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "results").rglob("README.md")),
             *sorted((REPO / "configs").rglob("*.yaml"))]
    out = []
    for path in files:
        text = re.sub(r"\\\n\s*(?:#\s*)?", " ", path.read_text())
        for match in _COMMAND.finditer(text):
            config, rest = match.group(1), match.group(2).split("`")[0].split(" #")[0]
            if "$" in rest or "…" in rest or not (REPO / config).is_file():
                continue
            try:
                args = shlex.split(rest)
            except ValueError:  # a quote closed on another line: not a command as written
                continue
            sets = [args[i + 1] for i, a in enumerate(args[:-1]) if a == "--set"]
            out.append((str(path.relative_to(REPO)), config, sets))
    return out


COMMANDS = documented_commands()


def test_the_documents_hold_commands() -> None:
    """The scan finds what it checks (a pattern that matched nothing would pass every case below vacuously)."""
    assert len(COMMANDS) > 100
    assert any(where == "README.md" for where, _c, _s in COMMANDS)


@pytest.mark.parametrize(("where", "config", "sets"), COMMANDS,
                         ids=[f"{w}:{c}:{i}" for i, (w, c, _s) in enumerate(COMMANDS)])
def test_a_documented_command_resolves(where: str, config: str, sets: list[str]) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a note on a dropped default is not a refusal
        load_config(str(REPO / config), sets)


def test_the_readmes_list_of_methods_names_every_registered_algorithm() -> None:
    """The README's **Train** bullet is where a reader meets the methods: it named 23 of 49 after the zoos' methods and
    the LoRA adapters were added. Each registered algorithm is named there (by its name with case, '-' and '_'
    ignored, or as the README writes the two whose names are not words: Agnostic FL, Fed-FSNet)."""
    import re

    from hetfed.registry import registry_of

    text = (REPO / "README.md").read_text()
    bullet = text[text.index("- **Train**"):text.index("- **Report**")]

    def norm(word: str) -> str:
        return re.sub(r"[^a-z]", "", word.lower())

    named = {norm(w) for w in re.split(r"[,;:()\s]+", bullet)} | {norm("Agnostic FL"), "fsnet"}
    assert "agnosticfl" in norm(bullet) and "fedfsnet" in norm(bullet)
    algorithms = registry_of("algorithm")  # hetfed's own (a test may have registered a plugin's in this process)
    names = [a for a in algorithms.names() if algorithms.get(a).cls.__module__.startswith("hetfed.")]
    assert [a for a in names if norm(a) not in named] == []
    assert f"{len(names)} registered algorithms" in bullet
