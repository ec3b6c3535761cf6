"""Imports go one way (../shared/DESIGN.md): config → data → models → engine and the interface → server →
algorithms → (Flower's engine) → runs → analysis → api / cli, with no circles.

Every import is checked, including those inside functions, so a lazy import cannot hide a dependency
that runs the wrong way; there is no exemption. A layer that needs a registry above it (the config schema
validating ``partition.kind``) asks :func:`hetfed.registry.registry_of`, which imports the kind's owner by name
at call time.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "hetfed"

#: (module prefix, layer), most specific first; a module may import its own layer and those below
LAYERS = [
    ("hetfed.errors", 0), ("hetfed.registry", 0), ("hetfed.console", 0), ("hetfed.heterogeneity", 0),
    ("hetfed.config", 0), ("hetfed.streams", 0),
    ("hetfed.config_io", 0), ("hetfed.config_legacy", 0), ("hetfed.config_base", 0), ("hetfed.config_train", 0),
    ("hetfed.config_server", 0), ("hetfed.config_flower", 0), ("hetfed.config_data", 0),
    ("hetfed.processes", 0), ("hetfed.environment", 0), ("hetfed.spelling", 0),
    ("hetfed.data", 1), ("hetfed.partition", 1), ("hetfed.server_data", 1), ("hetfed.pipeline", 1),
    ("hetfed.partition_report", 1),
    ("hetfed.models", 2),
    ("hetfed.engine", 3), ("hetfed.interface", 3), ("hetfed.gamma_summaries", 3),
    ("hetfed.server", 4), ("hetfed.leakage", 4), ("hetfed.run_spec", 4),
    ("hetfed.algorithms", 5),
    ("hetfed.flower.server_app", 9), ("hetfed.flower.deploy", 9), ("hetfed.flower", 6), ("hetfed.executors", 6),
    ("hetfed.runs", 7),
    ("hetfed.analysis", 8),
    ("hetfed.api", 9), ("hetfed.api_sweep", 9), ("hetfed.cli", 9), ("hetfed.xor_demo", 9), ("hetfed", 9),
]
NAMES = {0: "config", 1: "data", 2: "models", 3: "engine/interface", 4: "server", 5: "algorithms",
         6: "executors (in-process, Flower)", 7: "runs", 8: "analysis", 9: "api/cli"}

def layer(module: str) -> int:
    for prefix, level in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return level
    raise AssertionError(f"{module} has no layer: add it to LAYERS")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, top_level_only: bool = False) -> set[str]:
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else ast.walk(tree)
    found = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:  # ``from hetfed.engine import optim``: the module hetfed.engine.optim
                sub = f"{node.module}.{alias.name}"
                found.add(sub if (SRC.parent / (sub.replace(".", "/") + ".py")).exists() else node.module)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m == "hetfed" or m.startswith("hetfed.")}


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in SRC.rglob("*.py")}


def test_every_import_runs_down_the_layers():
    wrong = []
    for name, path in modules().items():
        for target in imports(path):
            if layer(target) > layer(name):
                wrong.append(f"{name} ({NAMES[layer(name)]}) imports {target} ({NAMES[layer(target)]})")
    assert not wrong, "\n".join(sorted(wrong))


def test_no_import_circles_at_module_level():
    graph = {name: {t for t in imports(path, top_level_only=True) if t != name} for name, path in modules().items()}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> None:
        if state.get(node) == 2:
            return
        assert state.get(node) != 1, "import circle: " + " → ".join([*trail, node])
        state[node] = 1
        for nxt in graph.get(node, ()):
            if nxt in graph:
                visit(nxt, [*trail, node])
        state[node] = 2

    for name in graph:
        visit(name, [])


def test_what_writes_a_run_never_imports_what_reads_it():
    for path in (SRC / "runs").glob("*.py"):
        assert not {m for m in imports(path) if m.startswith("hetfed.analysis")}, path


def test_the_engine_never_imports_an_algorithm():
    for path in (SRC / "engine").glob("*.py"):
        assert not {m for m in imports(path) if m.startswith("hetfed.algorithms")}, path


def test_no_algorithm_name_is_compared_outside_its_module():
    """The registry's promise: code outside algorithms/ asks capabilities, never compares a method's name."""
    import re

    from hetfed.algorithms import registry

    names = "|".join(re.escape(n) for n in registry.names())
    pattern = re.compile(rf"""(==|!=|\bin)\s*\(?\s*["'](?:{names})["']|["'](?:{names})["']\s*(==|!=)""")
    offenders = []
    for name, path in modules().items():
        if name.startswith("hetfed.algorithms"):
            continue
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(SRC)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_no_setting_is_read_through_the_algorithm_outside_algorithms():
    """#73: the loop, executors, server, attacks and driver read a method's settings from its RunSpec (resolved once
    by the plan), never from the algorithm object (``algo.train``, ``algo.context``, ``algo.schedule``), and only
    the resolution binds an algorithm to a federation."""
    import re

    pattern = re.compile(r"\balgo\w*\.(train|context|schedule)\b|\.algo\.(train|context|schedule)\b|\balgo\w*\.bind\(")
    outside = [(name, path) for name, path in modules().items()
               if not name.startswith("hetfed.algorithms") and name != "hetfed.interface"]
    offenders = [f"{path.relative_to(SRC)}:{i}: {line.strip()}" for name, path in outside
                 for i, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not offenders, "\n".join(offenders)


def test_the_server_chain_owns_the_screen():
    """#73 §4: the executors feed a round's updates to the chain's receiving side (decode, screen, clip); none of
    them builds a screen or decodes an upload itself."""
    import re

    pattern = re.compile(r"\bScreen\(|\bScreen\.for_round|transport\.decode\(")
    owners = {"hetfed.server.chain", "hetfed.server.screen", "hetfed.server.transport"}
    found = [f"{path.relative_to(SRC)}:{i}" for name, path in modules().items() if name not in owners
             for i, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, found


def test_the_run_directory_layout_has_one_owner():
    """Every file name of a run or sweep directory lives in runs/rundir.py; other modules import the name."""
    import re

    from hetfed.runs import rundir

    files = [v for k, v in vars(rundir).items() if k.isupper() and isinstance(v, str) and "." in v]
    assert {"config.yaml", "metrics.csv", "summary.json", "sweep.json", "runs.csv"} <= set(files)
    literal = re.compile("|".join(re.escape(f'"{f}"') for f in files))
    found = [f"{p.relative_to(SRC)}:{i}" for p in SRC.rglob("*.py") if p.name != "rundir.py"
             for i, line in enumerate(p.read_text().splitlines(), 1) if literal.search(line)]
    assert not found, found


def test_no_import_circles():
    """#46: no module reaches itself through imports (function-level ones included); the registries' discovery
    imports by name at call time and is not an edge."""
    mods = modules()
    graph = {name: {t for t in imports(path) if t in mods and t != name} for name, path in mods.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    import sys

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not circles, "\n".join(" ↔ ".join(c) for c in circles)


def test_no_function_over_60_lines_where_the_driver_and_engines_live():
    """#46: the run driver, the engines, the server and the executors stay in named steps a reader can hold."""
    long = []
    for name, path in modules().items():
        if (name.split(".") + [""])[1] not in {"runs", "engine", "server", "flower", "executors"}:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno >= 60:
                long.append(f"{name}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not long, "\n".join(long)


def test_no_source_file_over_600_lines():
    """A module holds one job: one past 600 lines holds several (split it where its parts stop sharing state)."""
    long = [f"{name}: {n} lines" for name, path in modules().items() if (n := len(path.read_text().splitlines())) > 600]
    assert not long, "\n".join(long)


def test_the_run_driver_names_no_executor():
    """#46: runs/ opens whatever executor a method names (a registry); no executor's name or module in it."""
    from hetfed.registry import registry_of

    names = set(registry_of("executor").names())
    found = []
    for name, path in modules().items():
        if not name.startswith("hetfed.runs"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{name}: {node.value!r}")
        found += [
            f"{name} imports {t}" for t in imports(path) if t.startswith(("hetfed.flower", "hetfed.executors.kinds."))
        ]
    assert not found, "\n".join(found)


def test_a_flower_clientapp_process_imports_no_heavy_library_before_it_needs_one():
    """#50 §2: a deployment starts a fresh ClientApp process per message; what it imports before training — the
    app, every registry's components (the config names them), a method built — is paid every message. SciPy,
    scikit-learn, pandas and matplotlib (~1.5 s together here) load only where a method's step uses them."""
    import subprocess
    import sys

    script = ("import sys, hetfed.flower.client_app\n"
              "from hetfed.config import build_config\n"
              "build_config({'methods': [{'algorithm': a} for a in ('fedavg', 'pfedfda', 'floco', 'fedpac')]})\n"
              "print(sorted(m for m in ('scipy', 'sklearn', 'pandas', 'matplotlib') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_in_process_executors_never_import_flower():
    """#73 §5: Flower's executor kinds live in flower/ and register themselves (hetfed.registry.PROVIDERS); the
    in-process executors work without it."""
    offenders = {name: sorted(m for m in imports(path) if m == "hetfed.flower" or m.startswith("hetfed.flower."))
                 for name, path in modules().items() if name.startswith("hetfed.executors")}
    assert {k: v for k, v in offenders.items() if v} == {}
    from hetfed.registry import registry_of

    assert {"flower", "deployment"} <= set(registry_of("executor").names())


def test_the_tests_mirror_the_package():
    """#73 §5: a package's tests live in tests/<package>/ (top-level modules' in tests/), shared fixtures in
    tests/conftest.py."""
    tests = Path(__file__).resolve().parent
    folders = sorted(d.name for d in tests.iterdir() if d.is_dir() and not d.name.startswith((".", "_")))
    assert folders and all((SRC / name / "__init__.py").is_file() for name in folders), folders
    assert all(p.name.startswith("test_") for d in folders for p in (tests / d).glob("*.py"))
