"""Imports go one way: the interface below both the engine and the algorithms.

``hetfed.interface`` imports neither the algorithms nor the engine's executors;
the engine's round loop, executors and evaluation never import an algorithm;
the algorithms never import the engine's round loop or executors (they use its
helpers: local training, optimisers, random streams, types).
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "hetfed"
ENGINE_RUNNERS = {"hetfed.engine.simulate", "hetfed.engine.executors", "hetfed.engine.evaluate", "hetfed.engine.sampling"}


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.startswith("hetfed")}


def test_the_interface_imports_neither_algorithms_nor_executors():
    bad = {m for m in imports(SRC / "interface.py") if m.startswith("hetfed.algorithms") or m in ENGINE_RUNNERS}
    assert not bad


def test_the_engine_never_imports_an_algorithm():
    for path in (SRC / "engine").glob("*.py"):
        assert not {m for m in imports(path) if m.startswith("hetfed.algorithms")}, path


def test_algorithms_never_import_the_round_loop_or_executors():
    for path in (SRC / "algorithms").glob("*.py"):
        assert not imports(path) & ENGINE_RUNNERS, path


def test_the_old_interface_module_is_gone():
    assert not (SRC / "algorithms" / "base.py").exists()
