"""The scripts of ``benchmarks/`` run to their end on a CPU at their smallest settings, and their JSON reports no error
(all but the seven named at the end; ``benchmarks/gpu.sh`` runs most of them on a lent GPU).

Why: the benchmarks are not imported by the package, so a change that moves a function or refuses a setting breaks them
silently — ``unequal.py`` imported two functions from the module they had left, and ``personalised.py`` gave ``cnn4``
the MLP's ``hidden`` widths, which the config now refuses (each of its rows an ``"error"``, exit status 0). A session
that is lent a GPU has ~15 minutes of it: a broken step there costs device time no one gets back. Timings are never
asserted here (benchmarks print them as ratios); only that each script works.

``lora_clients.py`` runs on a tiny BERT the test writes (MiniLM's weights are the ``text`` extra's, not the test
extra's; its ids 1000 and up were fixed in the script, and a smaller vocabulary has none), its timing mode only.

Not run here: ``engines.py`` (20 rounds per engine at least, ~2 minutes even for one small case), ``protocols.py``
(the papers' protocols on MNIST and Fashion-MNIST: ~25 s and more a case), ``peers.py`` and ``engine_against.py``
(another project's or another commit's checkout), and for the suite's time ``devices.py`` and ``flower_floor.py``
(~15 s each, neither a step of ``gpu.sh``; both ran at their smallest settings when this file was written).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

#: #74's CPU setting (logistic regression, 10 Dirichlet clients, evaluation every round)
_LOGREG = ["--set", "model.kind=logreg", "--set", "partition.kind=dirichlet", "--set", "partition.alpha=0.5",
           "--set", "train.eval_every=1", "--set", "methods=[{name: fedavg, algorithm: fedavg}]"]

#: (script, its smallest arguments): one test each
CASES = [
    ("personalised.py", ["--methods", "fedavg", "fedper", "--rounds", "1", "--dataset", "digits", "--json"]),
    ("personalised.py", ["--methods", "fedavg", "--rounds", "1", "--dataset", "digits", "--model", "mlp", "--json"]),
    ("unequal.py", ["--rounds", "1", "--threads", "1", "--json", "--samples", "2000"]),
    ("unequal.py", ["--rounds", "1", "--threads", "1", "--json", "--samples", "1000", "--model", "cnn4",
                    "--algorithms", "fedavg", "--executors", "sequential", "vectorised"]),
    ("engine.py", ["--json", "--rounds", "2", "--threads", "1", "--cases", "overhead_bound", "--repeats", "1"]),
    ("stacked_sweep.py", ["--rounds", "2", "--seeds", "1", "2", "--threads", "1"]),
    ("stacked_sweep.py", ["--rounds", "2", "--seeds", "1", "2", "--threads", "1", "--stacked-only"]),
    ("stacked_sweep.py", ["--per-round", "--rounds", "4", "--seeds", "1", "2", "--threads", "1", "--repeats", "1",
                          *_LOGREG]),
    ("stacked_sweep.py", ["--per-round", "--rounds", "4", "--seeds", "1", "--threads", "1", "--repeats", "1",
                          "--methods", "fedavg,fedprox", *_LOGREG]),
    ("asynchronous.py", ["--updates", "20", "--w1-rounds", "1", "--repeats", "1", "--threads", "1"]),
    ("bilstm.py", ["--clients", "1", "2", "--batch", "4", "--length", "8", "--threads", "1"]),
    ("checkpoint_cost.py", ["--set", "train.rounds=10", "--saves", "2", "--repeats", "1"]),
    ("client_scoring.py", ["--clients", "10", "--repeats", "3"]),
    ("conv_forms.py", ["--clients", "1", "2", "--batch", "4"]),
    ("each_method.py", ["--methods", "fedavg,knnper", "--set", "model.kind=mlp", "--seeds", "1", "--rounds", "2",
                        "--repeats", "1"]),
    ("dense_forms.py", ["--repeats", "1", "--steps", "2", "--threads", "1", "--only", "logreg",
                        "--random-layers", "2"]),
    ("gamma_beside.py", ["--config", str(BENCHMARKS.parent / "configs" / "default.yaml"), "--rounds", "2"]),
    ("gamma_threads.py", ["--config", str(BENCHMARKS.parent / "configs" / "default.yaml"), "--repeats", "1"]),
    ("gamma_threads.py", ["--features", "130", "--repeats", "1"]),
    ("profile_round.py", ["--rounds", "2", "--top", "5"]),
    ("protocol_flops.py", ["--config", str(BENCHMARKS.parent / "configs" / "default.yaml"), "--methods", "fedavg",
                           "ditto", "--rounds", "10", "--threads", "1"]),
    ("profile_sweep.py", ["--seeds", "2", "--rounds", "2", "--stack", "--threads", "1", "--top", "5"]),
    ("profile_sweep.py", ["--cprofile", "--stack", "--seeds", "2", "--rounds", "2", "--threads", "1", "--top", "5"]),
    ("profile_sweep.py", ["--cprofile", "--seeds", "1", "--rounds", "2", "--threads", "1", "--top", "5"]),
    ("scale.py", ["--clients", "100", "--fractions", "1.0", "--methods", "fedavg", "--rounds", "1", "--json"]),
    ("shared_preparation.py", ["--dataset", "digits", "--points", "2", "--seeds", "1", "--rounds", "1"]),
    ("step_cost.py", ["--steps", "5", "--threads", "1"]),
    ("sweep_presenting.py", ["--seeds", "2", "--rounds", "3"]),
]


def json_objects(text: str) -> list[Any]:
    """Every JSON object in ``text`` that starts a line (the scripts print JSON lines, or one indented object, after
    lines of their own such as ``sweep directory: …``)."""
    decoder, out, at = json.JSONDecoder(), [], 0
    while (start := text.find("{", at)) != -1:
        if start and text[start - 1] != "\n":
            at = start + 1
            continue
        value, at = decoder.raw_decode(text, start)
        out.append(value)
    return out


def errors_in(value: Any) -> list[str]:
    """Each ``"error"`` a benchmark's JSON holds, at any depth (a script that catches one case's failure reports it as
    a row's ``error`` and goes on)."""
    if isinstance(value, dict):
        return [str(v) for k, v in value.items() if k == "error"] + [e for v in value.values() for e in errors_in(v)]
    if isinstance(value, list):
        return [e for v in value for e in errors_in(v)]
    return []


def test_an_error_row_is_found_at_any_depth() -> None:
    """The check below can fail: a row's error, nested as personalised.py's are, is found."""
    printed = 'sweep directory: /x\n{"a": 1}\n{\n "rows": [\n  {"method": "fedavg", "error": "ConfigError: …"}\n ]\n}\n'
    assert errors_in(json_objects(printed)) == ["ConfigError: …"]


@pytest.mark.slow
@pytest.mark.parametrize(("script", "args"), CASES, ids=[f"{s}:{' '.join(a[:2])}" for s, a in CASES])
def test_a_benchmark_runs_to_its_end_on_a_cpu(script: str, args: list[str], tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{script} {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    found = json_objects(done.stdout)
    assert found, f"{script} printed no JSON:\n{done.stdout[-2000:]}"
    assert not errors_in(found), f"{script} reported errors: {errors_in(found)}"


def test_a_protocols_methods_are_read_from_its_config_as_it_writes_them(tmp_path: Path) -> None:
    """``method_entries`` — what ``protocol_flops.py`` counts and ``pfllib_protocol.sh`` runs — gives each named
    method's entry in the protocol's config (the protocol's Per-FedAvg trains two epochs a round: counted with one,
    its training was half of what the protocol runs); a name the config lacks is refused, naming it, or with
    ``plain`` its plain algorithm."""
    from hetfed.config_io import method_entries
    from hetfed.errors import ConfigError

    config = str(BENCHMARKS.parent / "configs" / "leaderboard_pfllib_fmnist.yaml")
    perfedavg, pfedme = method_entries(config, ["perfedavg", "pfedme"])
    assert perfedavg["train"] == {"local_epochs": 2}
    assert pfedme["params"] == {"lam": 1.0, "personal_lr": 0.01}
    assert method_entries(config, ["fedmoe"], plain=True) == [{"name": "fedmoe", "algorithm": "fedmoe"}]
    with pytest.raises(ConfigError, match=r"has no method named \['fedmoe'\]: it has \[.*'perfedavg'"):
        method_entries(config, ["perfedavg", "fedmoe"])
    unnamed = tmp_path / "unnamed.yaml"
    unnamed.write_text("methods: [{algorithm: fedprox, params: {mu: 0.1}}]\n")
    assert method_entries(unnamed, ["fedprox"]) == [{"algorithm": "fedprox", "params": {"mu": 0.1}}]


@pytest.mark.slow
def test_the_lora_benchmark_runs_to_its_end_on_a_tiny_encoder(tmp_path: Path) -> None:
    """``lora_clients.py`` on an encoder folder the test writes: it ran only where MiniLM's weights were installed,
    and its token ids assumed MiniLM's vocabulary. Its own check holds: the stack's first loss is peft's. (Its
    ``--memory`` mode, a process per way, ran too when this test was written — 17 CPU-seconds the suite does not
    have: README.)"""
    mode = ["--repeats", "1", "--from-layer", "1", "--clients", "1", "2"]
    pytest.importorskip("peft")
    from tests.tiny_bert import write_tiny_bert

    folder = write_tiny_bert(tmp_path / "tiny_bert")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, str(BENCHMARKS / "lora_clients.py"), "--path", str(folder), "--batch", "2",
                           "--length", "8", *mode], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (report,) = json_objects(done.stdout)
    rows = report["rows"]
    assert not errors_in(report) and [row["clients"] for row in rows] == [1, 2]
    for row in rows:
        assert all(math.isfinite(v) and v >= 0 for v in row.values()), row
        assert row["first_loss_stacked"] == pytest.approx(row["first_loss_peft_loop"], rel=1e-5)
        assert row["first_loss_stacked_from_layer"] == pytest.approx(row["first_loss_peft_loop_from_layer"], rel=1e-5)


def test_every_file_a_gpu_script_names_is_there() -> None:
    """The scripts a lent GPU runs (``benchmarks/*.sh``, the calls prepared in ``results/*/``) name test files and
    benchmarks by path: one that moves breaks a step that costs device time no one gets back (``gpu.sh`` still named
    ``tests/flower/test_flower.py`` after that file was split)."""
    repo = BENCHMARKS.parent
    missing = []
    for script in [*BENCHMARKS.glob("*.sh"), *repo.glob("results/*/*.sh")]:
        text = script.read_text()
        named = set(re.findall(r"(?:tests|benchmarks)/[\w/]+\.py", text))
        named |= {f"benchmarks/{name}" for name in re.findall(r"\$py (\w+\.py)", text)}  # run from benchmarks/
        missing += [f"{script.relative_to(repo)}: {path}" for path in sorted(named) if not (repo / path).is_file()]
    assert not missing


def test_the_pfllib_protocol_script_runs_each_method_as_the_protocols_config_has_it(tmp_path: Path) -> None:
    """``pfllib_protocol.sh`` names its methods and runs each as its entry in the protocol's config (``--methods``:
    its parameters and train settings; it wrote them out once, and its Per-FedAvg had neither of the config's
    PFLlib settings): PFLlib's 17 that hetfed has and Local, every name the config's. A name the config lacks stops
    it before any sweep starts."""
    from hetfed.config import load_config

    script = BENCHMARKS / "pfllib_protocol.sh"
    config = load_config(str(BENCHMARKS.parent / "configs" / "leaderboard_pfllib_fmnist.yaml"))
    groups = re.search(r"groups=\((.*?)\)", script.read_text(), re.S).group(1)  # type: ignore[union-attr]
    names = [name for line in re.findall(r"'([^']*)'", groups) for name in line.split()]
    assert len(names) == len(set(names)) == 18 and set(names) <= {m.name for m in config.methods}
    assert '--methods "$methods" --each-method' in script.read_text()
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"),
           "METHOD_GROUPS": "fedavg;no_such_method", "DEVICE": "cpu"}
    done = subprocess.run(["bash", str(script)], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "has no method named ['no_such_method']" in done.stderr
    assert not [p.name for p in (tmp_path / "out").iterdir()]  # nothing started, nothing written


@pytest.mark.slow
def test_the_pfllib_protocol_scripts_runs_end_whole_within_their_budget(tmp_path: Path) -> None:
    """The script gives each run's rounds ``ROUNDS_S`` seconds (``train.time_limit``) and the runs end as runs do:
    every run complete, and FedBABU's fine-tuned models — PFLlib's number for it, which a run stopped by SIGTERM
    never reached — in the table at the rounds their run trained (digits on the CPU, in seconds)."""
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "out"), "METHOD_GROUPS": "fedbabu",
           "DATASET": "digits", "DEVICE": "cpu", "BUDGET": "120", "ROUNDS_S": "3", "THREADS": "1", "PROCS": "1"}
    done = subprocess.run(["bash", str(BENCHMARKS / "pfllib_protocol.sh")], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "each run's rounds limited to 3 s (train.time_limit)" in (tmp_path / "out" / "log.txt").read_text()
    rows = {cells[2].strip(): (cells[3].strip(), cells[4].strip()) for cells in
            (r.split("|") for r in (tmp_path / "out" / "against_pfllib.md").read_text().splitlines())
            if len(cells) > 4 and cells[1].strip() == "FedBABU"}
    assert set(rows) == {"fedbabu", "fedbabu_ft"} and rows["fedbabu"][0] == rows["fedbabu_ft"][0]
    assert 1 <= int(rows["fedbabu"][0]) < 2000  # the rounds that fitted in 3 s
    assert rows["fedbabu_ft"][1].endswith("(3 seeds)")  # every seed's run fine-tuned its clients
