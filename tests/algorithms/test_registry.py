"""The algorithm registry (#24): every algorithm declares itself, and every engine serves every algorithm.

The parity tests here are parametrised over the registry: an algorithm registered tomorrow is run on the
vectorised and sequential executors (and, in the slow test, on Flower's Simulation Engine) without a test
of its own. A toy algorithm defined in this file registers itself and runs like the built-in ones.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from hetfed.algorithms import registry
from hetfed.algorithms.fedavg import FedAvg
from hetfed.algorithms.registry import AlgorithmParams, AlgorithmSpec, Capabilities
from hetfed.cli import main
from hetfed.config import build_config, migrate_legacy
from hetfed.config_legacy import legacy_sections
from hetfed.engine.types import ServerState, Upload
from hetfed.errors import ConfigError
from hetfed.interface import server_step
from hetfed.runs.runner import run_experiment
from tests.feature_methods import reads_features
from tests.flower_compare import compare
from tests.one_actor import ONE_ACTOR

SMALL = {"partition": {"kind": "dirichlet", "alpha": 0.5, "clients": 4, "min_size": 20},
         "train": {"rounds": 2, "local_steps": 3, "batch_size": 16, "eval_every": 1}}




def _config(algorithms: list[str], executor: str, **extra) -> object:
    methods = [{"name": f"{a}_", "algorithm": a, "params": dict(registry.get(a).quick),
                **({"model": dict(registry.get(a).model)} if registry.get(a).model else {})} for a in algorithms]
    raw = json.loads(json.dumps({**SMALL, **extra, "methods": methods}))
    raw["train"]["executor"] = executor
    raw.setdefault("flower", {})["connect_timeout"] = 300
    if executor == "flower":
        raw["flower"].update(ONE_ACTOR)
    return build_config(raw)


# ------------------------------------------------------------------ a toy algorithm, registered here


class SignParams(AlgorithmParams):
    step: float = 0.01


class SignAverage(FedAvg):
    """FedAvg whose server moves every coordinate by ``step`` in the sign of the average update."""

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        average, extra = server_step(self, state, upload)
        params = {k: v + self.params.step * torch.sign(average[k] - v) for k, v in state.params.items()}
        return ServerState(params, state.round + 1, extra)


TOY = "toy_sign"
#: registered when this module is imported — by pytest here, and by Flower's ClientApps through ``plugins``
registry.register(AlgorithmSpec(TOY, SignAverage, "a test's toy", "—", SignParams, Capabilities()))

#: the algorithms the default data's models can run, the toy included (the LoRA methods read a tokenizer's ids)
ON_FEATURES = [n for n in registry.names() if reads_features(n)]


@pytest.fixture
def toy():
    registry.register(AlgorithmSpec(TOY, SignAverage, "a test's toy", "—", SignParams, Capabilities()))
    yield TOY


def test_a_toy_algorithm_registered_in_a_test_runs_on_both_executors_and_is_listed(tmp_path, toy, capsys):
    a = run_experiment(_config([toy], "vectorised"), out=tmp_path / "v", progress=False).summary
    b = run_experiment(_config([toy], "sequential"), out=tmp_path / "s", progress=False).summary
    compare(a, b, rel=1e-4, abs=1e-5)
    assert main(["algorithms", "--json"]) == 0
    listed = {d["name"]: d for d in json.loads(capsys.readouterr().out)}
    assert listed[toy]["params"] == [{"name": "step", "default": 0.01, "type": "float", "bounds": {},
                                      "description": ""}]


# ------------------------------------------------------------------ every registered algorithm


@pytest.mark.parametrize("name", ON_FEATURES)
def test_every_registered_algorithm_gives_the_same_numbers_on_both_in_process_executors(tmp_path, name):
    a = run_experiment(_config([name], "vectorised"), out=tmp_path / "v", progress=False).summary
    b = run_experiment(_config([name], "sequential"), out=tmp_path / "s", progress=False).summary
    compare(a, b, rel=1e-4, abs=1e-5)


@pytest.mark.slow
def test_every_registered_algorithm_gives_the_vectorised_numbers_on_flowers_simulation_engine(tmp_path, monkeypatch):
    """One Flower run holds every registered algorithm (one Ray start), so the test costs one simulation —
    this file's toy algorithm included: Flower's ClientApps import this module as a plugin."""
    pytest.importorskip("flwr")
    root = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    # asynchronous methods refuse client sampling (their concurrency says who trains); tests/executors/test_async.py
    # runs
    # them on Flower
    names = [n for n in registry.names() if reads_features(n) and not registry.get(n).capabilities.asynchronous]
    assert TOY in names
    # half the clients per round: server state that depends on who took part (SCAFFOLD's c, AFL's valuations)
    extra = {"plugins": ["tests.algorithms.test_registry"], "train": {**SMALL["train"], "client_fraction": 0.5}}
    flower = run_experiment(_config(names, "flower", **extra), out=tmp_path / "f", progress=False).summary
    vec = run_experiment(_config(names, "vectorised", **extra), out=tmp_path / "v", progress=False).summary
    compare(vec, flower, rel=1e-4, abs=1e-5)


def test_a_plugin_that_cannot_be_imported_is_one_line():
    with pytest.raises(ConfigError, match=r"plugins\.0 = 'no_such_module' cannot be imported"):
        build_config({"plugins": ["no_such_module"]})


def test_algorithms_lists_every_algorithm_with_its_parameters_and_capabilities(capsys):
    assert main(["algorithms", "--json"]) == 0
    listed = {d["name"]: d for d in json.loads(capsys.readouterr().out)}
    assert set(listed) == set(registry.names()) >= {"fedavg", "fedprox", "scaffold", "afl", "feddf", "fedgen",
                                                      "fedmoe", "fsnet", "local", "feddyn", "fednova"}
    assert {p["name"]: p["default"] for p in listed["fedprox"]["params"]} == {"mu": 0.01}
    assert listed["fedprox"]["params"][0]["bounds"] == {"ge": 0}
    assert listed["feddf"]["capabilities"]["server_data"] and listed["feddf"]["capabilities"]["whole_round"]
    assert listed["fedmoe"]["capabilities"]["views"] == ["local", "fedavg", "finetuned", "mixture"]
    assert not listed["local"]["capabilities"]["server_model"]
    assert main(["algorithms"]) == 0
    text = capsys.readouterr().out
    assert all(name in text for name in listed)


# ------------------------------------------------------------------ moved keys, bad params


@pytest.mark.parametrize("section,algorithm", sorted(legacy_sections().items()))
def test_an_old_top_level_section_names_its_new_key(section, algorithm):
    with pytest.raises(ConfigError, match=rf"top-level section '{section}' .* move them to methods\.1\.params"):
        build_config({section: {}, "methods": [{"algorithm": "fedavg"}, {"algorithm": algorithm}]})


def test_old_train_keys_name_the_parameter_that_took_them_over(capsys):
    assert main(["config", "--set", "train.prox_mu=0.1", "--set", "methods=[{algorithm: fedprox}]"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "train.prox_mu = 0.1 is no longer a train key" in err and "methods.0.params.mu" in err


@pytest.mark.parametrize("item,expected", [
    ("methods.0.params.mu=-1", "methods.0.params.mu = -1: Input should be greater than or equal to 0"),
    ("methods.0.params.typo=1", "unknown key 'methods.0.params.typo' = 1: algorithm 'fedprox' takes ['mu']"),
    ("methods.0.params.muu=1", "unknown key 'methods.0.params.muu' = 1: did you mean 'methods.0.params.mu'? algorithm "
                               "'fedprox' takes ['mu']"),
])
def test_bad_params_get_one_line_naming_the_key(capsys, item, expected):
    assert main(["config", "--set", "methods=[{algorithm: fedprox}]", "--set", item]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expected in err, err


def test_an_unknown_algorithm_lists_the_registered_ones():
    with pytest.raises(ConfigError, match=r"methods\.0\.algorithm = 'fedsgd' is not allowed: expected one of"):
        build_config({"methods": [{"algorithm": "fedsgd"}]})


def test_a_run_directory_written_before_the_registry_still_reads():
    old = {"train": {"prox_mu": 0.3, "scaffold_option": 1, "server_lr": 0.5},
           "moe": {"max_epochs": 7}, "fsnet": {"server_steps": 9},
           "methods": [{"algorithm": "fedprox"}, {"algorithm": "scaffold"}, {"algorithm": "fedmoe"},
                       {"algorithm": "fsnet"}, {"name": "plain", "algorithm": "fedavg"}]}
    cfg = build_config(migrate_legacy(old))
    assert [m.params for m in cfg.methods] == [{"mu": 0.3}, {"option": 1}, {"max_epochs": 7}, {"server_steps": 9},
                                              {}]
    assert cfg.server.optimizer.lr == 0.5


def test_capabilities_not_names_decide_what_is_refused():
    from hetfed.runs.plan import check_config

    with pytest.raises(ConfigError, match=r"needs unlabeled server data"):  # the plan's check between components
        check_config(build_config({"server_data": {"source": "none"}, "methods": [{"algorithm": "feddf"}]}))
    with pytest.raises(ConfigError, match=r"DP-FedAvg does not privatise; expected one of \[.*'feddyn'"):
        from hetfed.algorithms import algorithm_for

        cfg = build_config({"privacy": {"noise_multiplier": 1.0}, "methods": [{"algorithm": "scaffold"}]})
        algorithm_for(cfg, cfg.methods[0], (64,), 10)


@pytest.mark.parametrize("name", ON_FEATURES)
def test_every_registered_algorithm_runs_as_the_default_configs_first_method_with_dropout(tmp_path, name):
    """``hetfed run --set methods.0.algorithm=NAME`` on the default data: its first method has dropout 0.5,
    which the parity runs above do not (Per-FedAvg once split its batch without splitting the dropout masks)."""
    import yaml

    from hetfed.config import dump_config

    spec = registry.get(name)
    raw = yaml.safe_load(dump_config(build_config()))  # the bundled default experiment
    raw["partition"]["clients"] = 4
    raw["train"].update({"rounds": 1, "local_steps": 2, "executor": "vectorised"})
    raw["methods"] = [{"name": "m", "algorithm": name, "params": dict(spec.quick),
                       "model": dict(spec.model) or {"kind": "mlp", "dropout": 0.5}}]
    summary = run_experiment(build_config(raw), out=tmp_path / "r", progress=False).summary
    assert summary["methods"]


def test_the_algorithm_interface_stays_small():
    """#46: an algorithm is 14 functions plus its declared capabilities (≤ 15 names to learn), and what it is
    built with; a name added to the base class is a decision this test makes visible (#76 added
    ``private_steps``: the passes over a client's data a round takes, which DP-SGD's ε composes — only the method
    knows them, Ditto's personal model being a second; ``findings``: what the server's step found that a user studies —
    which cluster each uploading client is in, to score a clustered method against the clients' concepts (IFCA,
    CFL), Agnostic FL's λ, CFL's update norms; {} for every other method; it replaced ``clusters``, which only
    clustered methods could fill)."""
    import inspect

    from hetfed.config import ModelConfig, TrainConfig
    from hetfed.interface import Algorithm
    from hetfed.models import build_model

    members = {n for n, _ in inspect.getmembers(Algorithm) if not n.startswith("_")}
    functions = {"server_init", "broadcast", "client_init", "local_update", "aggregate", "personalise",
                 "predictor", "evaluate_client", "evaluate_server", "select_clients", "bind", "personal_plan",
                 "private_steps", "findings"}
    assert members == functions | {"capabilities", "spec"}
    assert len(functions | {"capabilities"}) <= 15
    algo = FedAvg(build_model(ModelConfig(hidden=[4]), (3,), 2), TrainConfig())
    given = {n for n in vars(algo) if not n.startswith("_")}
    assert given == {"model", "train", "params", "context", "schedule"}


def test_algorithms_says_each_methods_family_and_venue(capsys):
    """#48 §5: the leaderboard and the docs group methods by family; each names where its paper appeared."""
    from hetfed.algorithms.registry import FAMILIES, AlgorithmSpec

    assert main(["algorithms", "--json"]) == 0
    listed = {d["name"]: d for d in json.loads(capsys.readouterr().out)}
    assert {d["family"] for d in listed.values()} == set(FAMILIES)
    assert listed["moon"]["family"] == "prototype/contrastive" and listed["moon"]["venue"] == "CVPR 2021"
    assert listed["ifca"]["family"] == "clustered" and listed["ditto"]["family"] == "personalised"
    assert all(d["venue"] for n, d in listed.items() if n != "local" and not n.startswith("toy"))
    with pytest.raises(ValueError, match=r"family = 'zoo'; expected one of global"):
        AlgorithmSpec("x", FedAvg, "", "", family="zoo")


def test_components_help_names_every_kind_and_each_kinds_parameters_where_a_config_writes_them(capsys):
    """#72 §4: the help listed 4 of the 9 kinds; algorithms' parameters were shown as `algorithm.<name>`, where a
    config writes `methods[i].params.<name>`."""
    from hetfed.registry import KINDS

    with pytest.raises(SystemExit):
        main(["components", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert all(kind in text for kind in KINDS)
    assert main(["components", "algorithm"]) == 0
    out = capsys.readouterr().out
    assert "methods[i].params." in out and "algorithm." not in out.replace("algorithm ", "")
    assert main(["components", "compressor"]) == 0
    assert "server.compression." in capsys.readouterr().out


def test_which_methods_aggregate_runs_together_is_the_protocols_answer():
    """A stacked sweep asks :func:`hetfed.interface.aggregates_runs` of a method's class instead of ``isinstance``
    with the protocol (~30 µs a call): the same answer for every registered method."""
    from hetfed.interface import AggregatesRuns, _aggregates_runs, aggregates_runs

    classes = {spec.cls for spec in registry.specs()}
    assert {c for c in classes if _aggregates_runs(c)} == {c for c in classes if issubclass(c, AggregatesRuns)}
    assert sum(_aggregates_runs(c) for c in classes) >= 5
    assert not aggregates_runs(FedAvg.__new__(FedAvg))


def test_runs_of_a_method_whose_server_is_the_chain_alone_aggregate_in_one_call():
    """#74: a stacked sweep aggregates runs of equal :func:`hetfed.interface.aggregate_key` in one call — a method's
    own key (FedGen's), or the server chain's for a method whose server is the chain alone (FedAvg's, FedProx's); a
    method that changes its aggregation without a run-axis form of it (SCAFFOLD) aggregates alone (None)."""
    from hetfed.algorithms import build_algorithm
    from hetfed.config import ModelConfig, TrainConfig
    from hetfed.interface import aggregate_key
    from hetfed.models import build_model

    algos = [build_algorithm(name, build_model(ModelConfig(hidden=[4]), (3,), 2), TrainConfig())
             for name in ("fedavg", "fedprox", "scaffold", "fedgen")]
    state = ServerState({"w": torch.zeros(2)})
    upload = Upload([0], {"w": torch.zeros(1, 2)}, torch.ones(1), {})
    keys = [aggregate_key(algo, state, upload) for algo in algos[:3]]
    assert keys[0] == keys[1] == ("server chain", algos[0].context.pipeline.identity) and keys[2] is None
    fedgen = ServerState({"w": torch.zeros(2)}, extra={"generator": {"w": torch.zeros(1)}})
    assert aggregate_key(algos[3], fedgen, upload)[0] == "own"
