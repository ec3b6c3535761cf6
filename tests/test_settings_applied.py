"""#45: a setting a user typed is applied or refused, never silently ignored. Each test failed on the main
before the fix (the command it mirrors is in its docstring)."""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pytest
import yaml

from hetfed.cli import main
from hetfed.config import as_given, build_config, load_config, method_section, unread_keys
from hetfed.errors import ConfigError, HetfedNote
from tests.one_actor import ONE_ACTOR_SET

ROOT = Path(__file__).resolve().parents[1]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and err.splitlines()[-1] == errors[0], err
    return errors[0]


# ------------------------------------------------------------------ 1. a top-level override wins over a method's own


def test_a_set_model_kind_reaches_every_method_and_charlstm_on_digits_is_refused(tmp_path, capsys):
    """`hetfed run --set model.kind=charlstm` on digits trained the default MLP and CGAU and exited 0."""
    out = tmp_path / "r"
    assert main(["run", "--set", "model.kind=charlstm", "--set", "train.rounds=1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "note: model.kind = 'charlstm' replaces methods.0.model.kind = 'mlp' (method 'relu')" in err
    assert "note: model.kind = 'charlstm' replaces methods.1.model.kind = 'cgau' (method 'cgau')" in err
    assert ("error: methods.0 model.kind = 'charlstm' with embed.kind = 'identity' is not allowed "
            "(dataset.name = 'digits')") in err
    assert not out.exists()


def test_a_refused_value_is_one_line_without_the_notes_of_what_it_would_have_replaced(tmp_path, capsys):
    """`--set model.kind=foo` printed two notes (it replaces each method's model) above its one-line error: notes
    about a value refused anyway. They are told once the config is valid (the test above: a valid kind that the
    data refuses later keeps them)."""
    assert main(["run", "--set", "model.kind=foo", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: invalid config: model.kind = 'foo' is not allowed"), err
    assert not (tmp_path / "r").exists()


def test_a_set_top_level_key_is_each_methods_effective_value_and_the_saved_config_says_so():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config(ROOT / "configs/shakespeare.yaml", ["dataset.plays=[tempest]", "train.rounds=2"])
    assert [cfg.method_train(m).rounds for m in cfg.methods] == [2, 2]
    assert any("methods.1.train.rounds = 300 (method 'fedsgd')" in str(w.message)
               and "use methods.1.train.rounds" in str(w.message) for w in caught)
    # the more specific override still wins: --set methods.1.train.rounds=5 after the top-level one
    cfg = load_config(ROOT / "configs/shakespeare.yaml", ["train.rounds=2", "methods.1.train.rounds=5"])
    assert [cfg.method_train(m).rounds for m in cfg.methods] == [2, 5]
    # a key set in the file on both levels keeps the file's per-method value (no override was typed)
    assert [cfg.method_train(m).batch_size for m in load_config(ROOT / "configs/shakespeare.yaml").methods][1] \
        == 1_000_000


def test_hetfed_config_shows_each_methods_effective_settings(capsys):
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert "#   methods.0 relu (fedavg): model.dropout = 0.5" in out
    assert '#   methods.1 cgau (fedavg): model.kind = "cgau", model.dropout = 0.5' in out
    assert main(["config", "--set", "model.dropout=0.2"]) == 0
    out = capsys.readouterr().out
    assert "#   methods.0 relu (fedavg): none" in out and yaml.safe_load(out)["methods"][0]["model"] == {"kind": "mlp"}


@pytest.mark.slow
def test_a_grid_over_a_top_level_key_a_method_sets_changes_the_numbers(tmp_path):
    """`hetfed sweep configs/default.yaml --grid model.dropout=0,0.9 --seeds 1` gave identical numbers."""
    assert main(["sweep", str(ROOT / "configs/default.yaml"), "--grid", "model.dropout=0,0.9", "--seeds", "1",
                 "--set", "train.rounds=2", "--set", "partition.clients=4", "--set", "train.local_steps=3",
                 "--out", str(tmp_path / "s"), "--quiet"]) == 0
    runs = [json.loads(p.read_text()) for p in sorted((tmp_path / "s").glob("*/seed=0/summary.json"))]
    assert len(runs) == 2
    # the loss, not the accuracy: after 2 short rounds both can sit at chance (0.1) with different models
    losses = [r["methods"]["relu"]["final"]["val_loss"] for r in runs]
    assert losses[0] != losses[1]
    saved = [yaml.safe_load(p.read_text()) for p in sorted((tmp_path / "s").glob("*/seed=0/config.yaml"))]
    assert [[m["model"].get("dropout") for m in c["methods"]] for c in saved] == [[None, None], [None, None]]
    assert [c["model"]["dropout"] for c in saved] == [0.0, 0.9]


# ------------------------------------------------------------------ 2. keys the chosen kind does not read


@pytest.mark.parametrize("sets,expected", [
    (["partition.alpha=0.1"], "unknown key 'partition.alpha' = 0.1: did you mean 'alpha' of partitioner 'dirichlet'? "
                              "partitioner 'feature_clusters' takes ['pca_components', 'shuffle']"),
    (["embed.components=8"], "unknown key 'embed.components' = 8: did you mean 'components' of embedding 'pca'? "
                             "embedding 'identity' has no parameters of its own"),
    (["dataset.plays=[tempest]"], "unknown key 'dataset.plays' = ['tempest']: did you mean 'plays' of dataset "
                                  "'shakespeare'? dataset 'digits' has no parameters of its own"),
    (["methods.0.model.condition_output=true"], "unknown key 'methods.0.model.condition_output' = True: did you mean "
                                                "'condition_output' of model 'cgau'? model 'mlp' takes ['dropout', "
                                                "'hidden']"),
    (["partition.shufle=true"], "unknown key 'partition.shufle' = True: did you mean 'partition.shuffle'? "
                                "partitioner 'feature_clusters' takes ['pca_components', 'shuffle']"),
    (["partition.kindd=x"], "unknown key 'partition.kindd' = 'x': did you mean 'partition.kind'? partitioner "
                            "'feature_clusters' takes"),  # a key of the section beside the component's own
    (["model.batch_norm=true"], "model.batch_norm = True is not allowed: neither model.kind = 'mlp' nor a method's "
                                "model takes it"),
    # YAML's flow mapping without a space after the colon: one key with no value, told the spelling that means it
    (["methods=[{name:x, algorithm: fedavg}]"], "unknown key 'methods.0.name:x' = None: YAML reads 'name:x' as one "
                                                "key with no value; write 'name: x' (a space after the colon)"),
    (["train.optimizer={kind:adam}"], "unknown key 'train.optimizer.kind:adam' = None: YAML reads 'kind:adam' as one "
                                      "key with no value; write 'kind: adam' (a space after the colon)"),
])
def test_a_key_the_chosen_component_does_not_take_is_refused_naming_what_it_takes(capsys, sets, expected):
    assert main(["config", *[a for s in sets for a in ("--set", s)]]) == 2
    err = capsys.readouterr().err
    assert expected in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("sets,expected", [
    (["methods=[{algorithm: local}]", "server.optimizer.lr=0.3"],
     "server.optimizer.lr = 0.3 is not read by any method"),
    (["methods=[{algorithm: local}]", "methods.0.server.optimizer.kind=adam"],
     "methods.0.server.optimizer.kind = 'adam' is not read: algorithm 'local' has no server model"),
    (["flower.ray_address=auto"], "flower.ray_address = 'auto' is not read with train.executor = 'vectorised': it "
                                  "applies to the Flower executors"),
    (["methods.0.model.kind=cnn4"], "methods.0.model.dropout = 0.5 is dropped: methods.0.model.kind = 'cnn4' does "
                                    "not take it"),
    # an optimiser's key its kind does not have: Adam's momentum, SGD's betas, in the method's own section or among
    # an algorithm's parameters (only the keys given there)
    (["train.optimizer.kind=adam", "train.optimizer.momentum=0.5"],
     "train.optimizer.momentum = 0.5 is not read by methods 'relu', 'cgau': its optimiser kind 'adam' has no "
     "'momentum'"),
    # relu's SGD reads it: only cgau is named (every method that does not read a top-level key is)
    (["methods.1.train.optimizer.kind=adamw", "train.optimizer.momentum=0.5"],
     "train.optimizer.momentum = 0.5 is not read by method 'cgau': its optimiser kind 'adamw' has no 'momentum'"),
    (["methods.1.train.optimizer.eps=0.01"],
     "methods.1.train.optimizer.eps = 0.01 is not read by method 'cgau': its optimiser kind 'sgd' has no 'eps'"),
    (["methods=[{algorithm: fedmoe, params: {local_optimizer: {lr: 0.001, momentum: 0.0}}}]"],
     "methods.0.params.local_optimizer.momentum = 0.0 is not read by method 'fedmoe': its optimiser kind 'adam' has "
     "no 'momentum'"),
    # a train key another one wins over, or that applies only with another, or that the executor does not read
    (["train.local_steps=5", "train.local_epochs=2"],
     "train.local_epochs = 2.0 is not read by methods 'relu', 'cgau': its local_steps = 5 wins over it"),
    (["methods.0.train.local_steps=5", "methods.0.train.local_epochs=3"],
     "methods.0.train.local_epochs = 3.0 is not read by method 'relu': its local_steps = 5 wins over it"),
    (["train.clients_per_round=3", "train.client_fraction=0.5"],
     "train.client_fraction = 0.5 is not read by methods 'relu', 'cgau': its clients_per_round = 3 wins over it"),
    (["train.steps_cap_one_pass=true"],
     "train.steps_cap_one_pass = True is not read by methods 'relu', 'cgau': it applies with local_steps, which is "
     "unset"),
    (["train.executor=sequential", "train.chunk_clients=4"],
     "train.chunk_clients = 4 is not read by methods 'relu', 'cgau': executor 'sequential' trains one client at a "
     "time"),
    (["train.clock.network_spread=0.5"], "train.clock.network_spread = 0.5 is not read by methods 'relu', 'cgau': no "
                                         "bandwidth is set (uplink_mbps, downlink_mbps)"),
    (["heterogeneity.iid_draws=0", "heterogeneity.iid_max_clients=5"],
     "heterogeneity.iid_max_clients = 5 is not read: heterogeneity.iid_draws = 0: no Γ_IID reference"),
    (["attack.fraction=0.3"], "attack.fraction = 0.3 is not read: attack.kind = 'none': no client is malicious"),
    (["server_data.source=holdout", "server_data.name=fashion-mnist"],
     "server_data.name = 'fashion-mnist' is not read: server_data.source = 'holdout' does not take it"),
    (["leakage.kind=dlg", "leakage.samples=50"], "leakage.samples = 50 is not read: leakage.kind = 'dlg' reads the "
                                                 "upload, not it"),
    (["leakage.kind=loss_threshold", "leakage.round=3"], "leakage.round = 3 is not read: leakage.kind = "
                                                         "'loss_threshold' reads the model, not it"),
    # a privacy or screen key without what turns it on
    (["privacy.clip=2.0"], "privacy.clip = 2.0 is not read: privacy.noise_multiplier is unset: no client-level DP"),
    (["privacy.delta=1e-6"], "privacy.delta = 1e-06 is not read: no noise is set (privacy.noise_multiplier, "
                             "privacy.record.noise_multiplier): no ε is computed"),
    (["privacy.record.clip=0.5"], "privacy.record.clip = 0.5 is not read: privacy.record.noise_multiplier is unset: "
                                  "no DP-SGD"),
    (["methods.1.server.screen.norm_factor=null", "methods.1.server.screen.reference_clients=5"],
     "methods.1.server.screen.reference_clients = 5 is not read by method 'cgau': server.screen.norm_factor is unset: "
     "no norm filter"),
])
def test_a_key_nothing_reads_is_noted_on_stderr(capsys, sets, expected):
    assert main(["config", *[a for s in sets for a in ("--set", s)]]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert any(expected in line for line in notes), notes


def test_keys_a_method_reads_are_not_noted_and_the_shipped_default_has_none():
    assert unread_keys(build_config()) == {}
    # cgau takes condition_output: a top-level value reaches the method whose model takes it
    config = build_config({}, {"model": {"condition_output": True}})
    assert unread_keys(config) == {}
    assert [method_section(config, m, "model").params.model_dump() for m in config.methods] == [
        {"hidden": [64, 64], "dropout": 0.5}, {"hidden": [64, 64], "dropout": 0.5, "condition_output": True}]
    assert unread_keys(build_config({"partition": {"kind": "dirichlet", "alpha": 0.1}})) == {}
    assert unread_keys(build_config({"train": {"executor": "flower"}, "flower": {"clients_per_node": 5}})) == {}
    # the relu method's SGD reads momentum: one method whose kind has it is no note; FedMoE's own Adam as it ships
    assert unread_keys(build_config({"train": {"optimizer": {"momentum": 0.5}}})) == {}
    assert unread_keys(build_config({"methods": [{"algorithm": "fedmoe", "params": {"optimizer": {"lr": 0.01}}}]})) \
        == {}
    # the key that wins, or one the executor reads, alone: no note; a method's own local_steps leaves the top-level
    # local_epochs read by the other method
    for train in ({"local_steps": 5, "steps_cap_one_pass": True}, {"clients_per_round": 3}, {"chunk_clients": 4}):
        assert unread_keys(build_config({"train": train})) == {}
    for privacy in ({"noise_multiplier": 1.0, "clip": 2.0, "delta": 1e-6, "weighting": "samples"},
                    {"record": {"noise_multiplier": 1.0, "clip": 0.5}, "delta": 1e-6}):
        assert unread_keys(build_config({"privacy": privacy})) == {}
    assert unread_keys(build_config({"server": {"screen": {"reference_clients": 5}}})) == {}
    assert unread_keys(build_config({"train": {"clock": {"network_spread": 0.5, "uplink_mbps": 10}}})) == {}
    for section, given in [("attack", {"kind": "sign_flip", "fraction": 0.3}),
                           ("leakage", {"kind": "dlg", "round": 3, "client": 2}),
                           ("leakage", {"kind": "loss_threshold", "samples": 50}),
                           ("server_data", {"source": "dataset", "name": "fashion-mnist", "max_samples": 100}),
                           ("heterogeneity", {"iid_draws": 5, "iid_max_clients": 5})]:
        assert unread_keys(build_config({section: given})) == {}, section
    speeds = build_config({"train": {"clock": {"latency": "file", "file": "speeds.csv", "sample_seconds": 0.01}}})
    assert unread_keys(speeds) == {"train.clock.sample_seconds": "train.clock.sample_seconds = 0.01 is not read by "
                                   "methods 'relu', 'cgau': train.clock.latency = 'file' reads every client's speeds "
                                   "from its file"}
    two = build_config({"train": {"local_epochs": 2}, "methods": [
        {"name": "a", "algorithm": "fedavg"}, {"name": "b", "algorithm": "fedavg", "train": {"local_steps": 3}}]})
    assert unread_keys(two) == {"train.local_epochs": "train.local_epochs = 2.0 is not read by method 'b': its "
                                                      "local_steps = 3 wins over it"}


@pytest.mark.parametrize("config", sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "configs").rglob("*.yaml")))
def test_no_shipped_config_sets_a_key_nothing_reads(config):
    assert unread_keys(load_config(ROOT / config)) == {}


def test_an_optimiser_among_an_algorithms_parameters_given_in_part_keeps_the_rest_of_its_default():
    """`params: {optimizer: {lr: 5e-5}}` on FedMoE trained with SGD and momentum 0.9 (the part validated alone, onto
    the plain optimiser's defaults), not the Adam FedMoE documents; its ``local_optimizer`` in part keeps the rest of
    ``optimizer``; a mistyped key in it is told the key it meant."""
    from hetfed.algorithms.registry import get

    fedmoe = get("fedmoe")
    assert fedmoe.make_params({"optimizer": {"lr": 5e-5}}).optimizer.model_dump() == {
        **fedmoe.make_params({}).optimizer.model_dump(), "lr": 5e-5}
    local = fedmoe.make_params({"optimizer": {"kind": "adamw", "weight_decay": 0.1}, "local_optimizer": {"lr": 5e-5}})
    assert (local.local_optimizer.kind, local.local_optimizer.weight_decay, local.local_optimizer.lr) == \
        ("adamw", 0.1, 5e-5)
    with pytest.raises(ConfigError, match=re.escape(
            "unknown key 'methods.0.params.optimizer.lrr' = 1: did you mean 'methods.0.params.optimizer.lr'? "
            "'methods.0.params.optimizer' of algorithm 'fedmoe' takes ['betas', 'eps', 'kind', 'lr', ")):
        fedmoe.make_params({"optimizer": {"lrr": 1}}, "methods.0.params")


def test_switching_the_component_drops_the_files_parameters_of_the_old_one_with_a_note(tmp_path):
    """`--set partition.kind=dirichlet` on a majority config: the file's p was written for majority."""
    path = tmp_path / "c.yaml"
    path.write_text("partition: {kind: majority, p: 0.9, clients: 6}\n")
    with pytest.warns(HetfedNote, match="partition.p = 0.9 is dropped"):
        config = load_config(path, ["partition.alpha=0.2", "partition.kind=dirichlet"])
    assert config.partition.params.alpha == 0.2 and config.partition.clients == 6
    with pytest.raises(ConfigError, match="unknown key 'partition.shuffle'"):  # typed with the choice: refused
        load_config(path, ["partition.shuffle=0.2", "partition.kind=dirichlet"])


def test_every_component_declares_its_own_parameters_apart_from_its_sections_shared_keys():
    """Every section chosen from a registry (dataset, embed, partition, model, attack, leakage; the server's combine,
    compression and optimizer inside it) holds only what the kind shares;
    each component's own keys are its ``Params``, declared in its file, and never shadow a shared key."""
    from hetfed.config import Config
    from hetfed.config_base import Chosen
    from hetfed.registry import ComponentParams, registry_of

    chosen = 0
    for name, field in Config.model_fields.items():
        section = field.annotation
        if isinstance(section, type) and issubclass(section, Chosen):
            chosen += 1
            for component, item in registry_of(section.chosen_by[0]).items():
                assert issubclass(item.Params, ComponentParams), (name, component)
                assert not set(item.Params.model_fields) & set(section.model_fields), (name, component)
    assert chosen == 6


# ------------------------------------------------------------------ 3. duplicate grid values


@pytest.mark.parametrize("grid,expected", [
    ("partition.shuffle=0,0", "--grid point partition.shuffle=0 is listed twice"),
    ("partition.shuffle=0,0.0", "--grid values partition.shuffle: 0 and 0.0 are the same setting once validated"),
])
def test_duplicate_grid_values_are_refused_before_anything_runs(tmp_path, capsys, grid, expected):
    out = tmp_path / "s"
    assert main(["sweep", str(ROOT / "configs/default.yaml"), "--grid", grid, "--seeds", "1", "--out", str(out)]) == 2
    assert expected in _one_line_error(capsys)
    assert not out.exists()


# ------------------------------------------------------------------ 4. an .npz whose x is 1-D


def test_an_npz_with_one_dimensional_x_is_refused_naming_the_shape(tmp_path, capsys):
    path = tmp_path / "d.npz"
    np.savez(path, x=np.arange(10, dtype=np.float32), y=np.arange(10) % 2)
    assert main(["partition", "--set", "dataset.name=arrays", "--set", f"dataset.path={path}"]) == 2
    line = _one_line_error(capsys)
    assert "array 'x' has shape (10,): expected samples × features" in line and "reshape(-1, 1)" in line


def test_texts_saved_as_a_string_array_still_load(tmp_path):
    from hetfed.data.formats import read_arrays

    path = tmp_path / "t.npz"
    np.savez(path, x=np.array(["a b", "c d"]), y=np.array([0, 1]))
    assert read_arrays(path)["x"].shape == (2,)


# ------------------------------------------------------------------ 5. hetfed partition validates no model


def test_partition_does_not_check_the_methods_models_but_run_does():
    """`hetfed partition --set dataset.name=shakespeare --set partition.kind=natural` was refused for the
    default methods' MLP."""
    from hetfed.runs.plan import check_config

    sets = ["dataset.name=shakespeare", "partition.kind=natural", "partition.clients=null"]
    config = load_config(None, sets)
    check_config(config, train=False)  # hetfed partition's plan: no method is trained
    with pytest.raises(ConfigError, match="need model.kind = 'charlstm'"):
        check_config(config)  # hetfed run's


# ------------------------------------------------------------------ 11. FedDF's holdout on Flower after a FedAvg run


def test_a_node_keeps_no_federation_of_another_runs_server_data_resolution():
    """A FedAvg run (server_data auto → none) cached its federation on the node; a FedDF run of the same data
    (auto → holdout) then trained on it, without the holdout cut (Flower 0.511 vs in-process 0.351)."""
    pytest.importorskip("flwr")
    from flwr.app import ConfigRecord

    from hetfed.config import dump_config
    from hetfed.flower import node
    from hetfed.pipeline import prepare

    fedavg = build_config({"partition": {"clients": 4}, "methods": [{"algorithm": "fedavg"}]})
    feddf = build_config({"partition": {"clients": 4}, "methods": [{"algorithm": "feddf"}]})
    for cfg in (fedavg, feddf):  # the first fills the node's on-disk federation cache
        node._CACHE.clear()
        side = node.node_side(ConfigRecord({"config": dump_config(cfg), "method": 0}))
    simulated = prepare(feddf, progress=False).federation
    assert len(side.fed.x) == len(simulated.x) and side.fed.server_x is not None
    assert all(np.array_equal(a, b) for a, b in zip(side.fed.train, simulated.train, strict=True))


def test_notes_are_one_line_each_and_not_python_warnings(capsys):
    assert main(["config", "--set", "flower.ray_address=auto", "--set", "model.dropout=0.1"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 3 and all(line.startswith("note: ") for line in err), err
    assert issubclass(__import__("hetfed.config", fromlist=["UnreadKey"]).UnreadKey, HetfedNote)


@pytest.mark.slow
def test_feddf_on_flower_gives_the_in_process_numbers_on_the_default_config_after_a_fedavg_run(tmp_path):
    """`hetfed run --set 'methods=[{name: m, algorithm: feddf}]' --set partition.clients=4 --set train.rounds=2
    --set train.executor=flower` gave 0.511 vs 0.351 in-process. The registry-wide parity test runs every
    algorithm in one config (so FedDF's holdout applies to all) with a fresh cache: a FedAvg run of the same
    data before it, as a user does, is what filled the node with a federation without the holdout."""
    pytest.importorskip("flwr")
    from flwr.app import ConfigRecord

    from hetfed.config import dump_config
    from hetfed.flower import node
    from hetfed.runs.runner import run_experiment

    sets = ["partition.clients=4", "train.rounds=2", "flower.connect_timeout=300", ONE_ACTOR_SET]
    fedavg = load_config(None, [*sets, "methods=[{name: m, algorithm: fedavg}]"])
    node._CACHE.clear()
    node.node_side(ConfigRecord({"config": dump_config(fedavg), "method": 0}))  # what a FedAvg run leaves on disk
    runs = {}
    for executor in ("flower", "vectorised"):
        cfg = load_config(None, [*sets, "methods=[{name: m, algorithm: feddf}]", f"train.executor={executor}"])
        runs[executor] = run_experiment(cfg, out=tmp_path / executor, progress=False).summary["methods"]["m"]
    for when in ("final", "best"):
        for key, value in runs["vectorised"][when].items():
            got = runs["flower"][when][key]
            assert (got is None and value is None) or got == pytest.approx(value, rel=1e-5, abs=1e-6), (when, key)


def test_a_grid_over_the_seed_is_refused_for_seeds_n(tmp_path, capsys):
    """`--grid seed=0,1 --seeds 1` ran seed 0 twice: every point's seed is overwritten by seed + s."""
    out = tmp_path / "s"
    assert main(["sweep", str(ROOT / "configs/default.yaml"), "--grid", "seed=0,1", "--seeds", "1",
                 "--out", str(out)]) == 2
    assert "the seeds are --seeds N" in _one_line_error(capsys) and not out.exists()


def test_a_methods_list_typed_with_a_top_level_key_keeps_its_own_values_and_says_nothing():
    """`--set methods=[…]` replaces the file's methods: a top-level key typed beside it neither strips the typed
    methods' values (the more specific override wins) nor notes the replaced file's methods."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_config(None, ['methods=[{algorithm: fedavg, model: {dropout: 0.3}}, {name: b, algorithm: fedavg}]',
                                 "model.dropout=0.1"])
    assert [cfg.method_model(m).dropout for m in cfg.methods] == [0.3, 0.1]
    assert not [w for w in caught if issubclass(w.category, HetfedNote)]


def test_a_grid_over_a_key_the_partition_does_not_take_is_refused_before_anything_runs(tmp_path, capsys):
    """`--grid partition.alpha=0.1,1` with feature_clusters would run the same training twice under two names."""
    code = main(["sweep", str(ROOT / "configs/default.yaml"), "--grid", "partition.alpha=0.1,1", "--seeds", "1",
                 "--out", str(tmp_path / "s"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and ("unknown key 'partition.alpha' = 0.1: did you mean 'alpha' of partitioner 'dirichlet'? "
                          "partitioner 'feature_clusters' takes") in err, err
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(("grid", "sets", "swept", "typed"), [
    ("train.rounds=1,2", "train.rounds=1", "train.rounds", "train.rounds=1"),
    ("train.optimizer={lr: 0.1},{lr: 0.2}", "train.optimizer.lr=0.3", "train.optimizer", "train.optimizer.lr=0.3"),
    ("train.optimizer.lr=0.1,0.2", "train.optimizer={lr: 0.3}", "train.optimizer.lr", "train.optimizer={lr: 0.3}"),
    ("train.optimizer={lr: 0.1},{kind: adam}", "train.optimizer.lr=0.3", "train.optimizer", "train.optimizer.lr=0.3"),
])
def test_a_key_both_set_and_swept_is_refused_before_anything_runs(tmp_path, capsys, grid, sets, swept, typed):
    """`hetfed sweep --grid train.rounds=1,2 --set train.rounds=1` ran rounds 1 and 2 and exited 0: the typed
    --set was silently replaced at every grid point."""
    out = tmp_path / "s"
    assert main(["sweep", str(ROOT / "configs/default.yaml"), "--grid", grid, "--set", sets, "--seeds", "1",
                 "--out", str(out)]) == 2
    assert _one_line_error(capsys).startswith(f"error: --grid {swept} is not allowed with --set {typed}: ")
    assert not out.exists()


def test_a_grid_beside_or_inside_a_set_value_is_allowed():
    """Keys that do not meet (siblings), and a grid refining part of a methods list typed whole, are not refused."""
    from hetfed.config_io import parse_grid, refuse_swept_overrides

    refuse_swept_overrides(parse_grid(["train.optimizer.lr=0.1,0.2"]), ["train.optimizer.momentum=0.9",
                                                                      "train.rounds=3"])
    refuse_swept_overrides(parse_grid(["methods.0.params.mu=0.01,0.1"]),
                           ["methods=[{name: p, algorithm: fedprox}]"])
    refuse_swept_overrides(parse_grid(["train.rounds_x=1,2"]), ["train.rounds=1"])  # a prefix of the text only
    # a mapping sets its own keys: the typed lr is kept at every point (as the sweep builds them)
    grid, sets = parse_grid(["train.optimizer={kind: adam},{kind: sgd}"]), ["train.optimizer.lr=0.3"]
    refuse_swept_overrides(grid, sets)
    base = as_given(load_config(ROOT / "configs/default.yaml", sets))
    assert [build_config(base, {"train.optimizer": v}).train.optimizer.lr for v in grid["train.optimizer"]] \
        == [0.3, 0.3]
    with pytest.raises(ConfigError, match="--grid model.hidden is not allowed with --set model.hidden.0=8"):
        refuse_swept_overrides(parse_grid(["model.hidden=[16],[32]"]), ["model.hidden.0=8"])


def test_partition_notes_each_typed_key_it_does_not_read(tmp_path, capsys):
    """`hetfed partition --set train.rounds=5` printed the partition and said nothing of the key it never read."""
    assert main(["partition", "--set", "train.rounds=5", "--set", "partition.clients=4", "--set", "model.dropout=0.1",
                 "--set", "methods=[{algorithm: feddf}]", "--json"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note: ")]
    assert [n.split(" is not read")[0] for n in notes] == ["note: --set train.rounds=5",
                                                           "note: --set model.dropout=0.1"]
    assert "hetfed partition: it reads only dataset, embed, plugins, server_data, partition" in notes[0]


def test_the_methods_decide_what_partition_cuts_for_the_server_while_server_data_is_auto():
    """Why a methods key is read by partition (no note) while server_data.source is auto: a method that needs server
    data makes the server hold a holdout, cut from the clients' data before partitioning."""
    from hetfed.pipeline import unread_by_preparation
    from hetfed.server_data import wanted

    typed = ["methods=[{algorithm: feddf}]"]
    assert wanted(load_config(None, typed)) == "holdout" and wanted(load_config(None)) == "none"
    assert unread_by_preparation(load_config(None, typed), typed) == []
    fixed = [*typed, "server_data.source=none"]
    assert len(unread_by_preparation(load_config(None, fixed), fixed)) == 1


# ------------------------------------------------------------------ --methods: some of a config's methods

def test_methods_runs_the_configs_named_methods_with_their_own_settings_and_refuses_a_name_it_lacks(tmp_path, capsys):
    """``hetfed run/sweep/config CONFIG --methods perfedavg,pfedme``: those entries of the config, in that order, each
    with its parameters and own train settings (written out by hand in ``--set methods=[…]``, PFLlib's Per-FedAvg
    had lost both of its protocol's settings); ``--set methods.N`` counts them. A name the config lacks, or an empty
    one, is a one-line error naming it (exit 2, nothing written); so are ``--set methods=[…]`` and ``--grid methods``
    beside it (either would replace the methods chosen) and ``--resume`` with it (the run's own config)."""
    protocol = str(ROOT / "configs" / "leaderboard_pfllib_fmnist.yaml")
    config = load_config(protocol, ["methods.1.params.lam=2.0"], methods=["perfedavg", "pfedme"])
    assert [(m.label, m.algorithm) for m in config.methods] == [("perfedavg", "perfedavg"), ("pfedme", "pfedme")]
    assert config.methods[0].train == {"local_epochs": 2} and config.methods[0].params == {"inner_lr": 0.005}
    assert config.methods[1].params == {"lam": 2.0, "personal_lr": 0.01}
    assert [m.label for m in load_config(None, methods=["cgau"]).methods] == ["cgau"]  # the built-in config's
    assert main(["config", protocol, "--methods", "fedrep"]) == 0
    assert "head_epochs: 1" in capsys.readouterr().out
    out = tmp_path / "run"
    assert main(["run", "--methods", "cgau,nosuch", "--out", str(out), "--quiet"]) == 2
    line = _one_line_error(capsys)
    assert "--methods 'cgau,nosuch'" in line and "no method named ['nosuch']" in line and "['cgau', 'relu']" in line
    assert not out.exists()
    with pytest.raises(SystemExit) as stop:
        main(["sweep", "--methods", "cgau,,relu", "--out", str(out)])
    assert stop.value.code == 2 and "'cgau,,relu' has an empty name" in capsys.readouterr().err
    assert main(["sweep", "--methods", "cgau", "--grid", "methods=[{algorithm: fedavg}]", "--out", str(out)]) == 2
    assert "--grid methods is not allowed with --methods 'cgau'" in _one_line_error(capsys)
    assert main(["run", "--methods", "cgau", "--set", "methods=[{algorithm: fedavg}]", "--out", str(out)]) == 2
    assert "--set methods=[…] is not allowed with --methods 'cgau'" in _one_line_error(capsys)
    assert main(["run", "--resume", str(out), "--methods", "cgau"]) == 2
    assert "not allowed with --methods" in _one_line_error(capsys)
    assert not out.exists()


def test_methods_applies_to_a_sweeps_runs(tmp_path):
    """A sweep of ``--methods cgau``: its runs train that method only (the resolved config is what it records)."""
    assert main(["sweep", "--methods", "cgau", "--set", "train.rounds=1", "--seeds", "1", "--out",
                 str(tmp_path / "s"), "--quiet", "--no-report"]) == 0
    runs = (tmp_path / "s" / "runs.csv").read_text().splitlines()
    assert {line.split(",")[1] for line in runs[1:]} == {"(data)", "cgau"}


def test_the_apis_load_config_chooses_methods_as_the_command_line_does():
    """``hetfed.load_config(source, overrides, methods=…)``: the methods ``--methods`` would choose, from a file, a
    dict or the built-in config, before the overrides; a name the source lacks and an override of ``methods`` beside
    it are ConfigErrors that name them."""
    import hetfed

    protocol = str(ROOT / "configs" / "leaderboard_pfllib_fmnist.yaml")
    config = hetfed.load_config(protocol, {"methods.1.params.lam": 2.0}, methods="perfedavg,pfedme")
    chosen = load_config(protocol, ["methods.1.params.lam=2.0"], methods=["perfedavg", "pfedme"])
    assert config.methods == chosen.methods and config.methods[1].params["lam"] == 2.0
    assert [m.label for m in hetfed.load_config(None, methods=["cgau"]).methods] == ["cgau"]
    given = {"methods": [{"name": "a", "algorithm": "fedavg"}, {"name": "b", "algorithm": "fedprox"}]}
    assert [m.algorithm for m in hetfed.load_config(given, methods=["b"]).methods] == ["fedprox"]
    with pytest.raises(ConfigError, match=r"methods = 'nosuch': the config \(file .*\) has no method named"):
        hetfed.load_config(str(ROOT / "configs" / "default.yaml"), methods="nosuch")
    with pytest.raises(ConfigError, match=r"an override of methods=\[…\] is not allowed with methods = 'cgau'"):
        hetfed.load_config(None, {"methods": [{"algorithm": "fedavg"}]}, methods=["cgau"])
