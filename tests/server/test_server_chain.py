"""#46 (server chain): the server pipeline as a chain of steps, combine rules one file each on a registry,
the robust and screen settings in ``server:`` (the old ``train`` keys still work, with a note), and old run
directories and checkpoints still read."""

from __future__ import annotations

import warnings

import pytest
import torch

from hetfed.config import ServerConfig, build_config, load_run_config, migrate_legacy
from hetfed.engine.types import Upload
from hetfed.errors import ConfigError, HetfedNote
from hetfed.server import combine as rules
from hetfed.server.combine import CombineRule, RuleParams
from hetfed.server.pipeline import server_chain


def test_every_rule_is_registered_from_its_own_file_and_says_whether_it_streams():
    assert {"krum", "mean", "median", "multi_krum", "trimmed_mean", "geometric_median", "centered_clipping",
            "bulyan"} <= set(rules.names())
    assert server_chain(ServerConfig()).streams
    for rule in ("median", "trimmed_mean", "krum", "multi_krum", "geometric_median", "centered_clipping", "bulyan"):
        assert not server_chain(ServerConfig(combine={"rule": rule})).streams, rule


@pytest.mark.parametrize("section,expected", [
    ({"rule": "mean", "fraction": 0.2}, "unknown key 'server.combine.fraction' = 0.2: did you mean 'fraction' of "
                                        "combine rule 'trimmed_mean'? combine rule 'mean' has no parameters of its "
                                        "own"),
    ({"rule": "trimmed_mean", "fraction": 0.7}, "server.combine.fraction = 0.7: Input should be less than 0.5"),
    ({"rule": "medain"}, "server.combine.rule = 'medain' is not allowed: did you mean 'median'? expected one of "
                         "['bulyan', 'centered_clipping', 'clipped_clustering', 'dnc', 'flame', 'fltrust'"),
])
def test_a_rules_parameters_are_validated_with_one_line_naming_the_key(section, expected):
    with pytest.raises(ConfigError) as err:
        build_config({"server": {"combine": section}})
    assert expected in str(err.value) and "\n" not in str(err.value)


class _MaxParams(RuleParams):
    pass


def _coordinate_max(old, upload, params):
    return {k: upload.params[k].max(0).values for k in old}


@pytest.fixture
def toy_rule():
    rules.register(CombineRule("toy_max", _coordinate_max, _MaxParams, streams=False, summary="a test's toy"))
    yield "toy_max"
    rules.RULES.unregister("toy_max")


def test_a_rule_registered_in_one_place_runs_end_to_end_on_both_executors(tmp_path, toy_rule):
    from hetfed.runs.runner import run_experiment

    def run(executor: str) -> dict:
        cfg = build_config({"partition": {"clients": 4}, "train": {"rounds": 2, "local_steps": 2, "executor": executor},
                            "server": {"combine": {"rule": toy_rule}}, "methods": [{"algorithm": "fedavg"}]})
        return run_experiment(cfg, out=tmp_path / executor, progress=False).summary["methods"]["fedavg"]["final"]

    a, b = run("vectorised"), run("sequential")
    assert a["global_accuracy"] == pytest.approx(b["global_accuracy"], abs=1e-6)
    mean = build_config({"partition": {"clients": 4}, "train": {"rounds": 2, "local_steps": 2},
                         "methods": [{"algorithm": "fedavg"}]})
    plain = run_experiment(mean, out=tmp_path / "mean", progress=False).summary["methods"]["fedavg"]["final"]
    assert plain["global_loss"] != pytest.approx(a["global_loss"])  # the rule was applied, not the mean


def test_the_old_train_keys_still_work_with_a_note_naming_the_new_key(capsys):
    from hetfed.cli import main

    assert main(["config", "--set", "train.aggregator=trimmed_mean", "--set", "train.trim_fraction=0.2",
                 "--set", "train.reject_norm_factor=null", "--set", "train.min_clients=3"]) == 0
    out, err = capsys.readouterr()
    assert "note: train.aggregator is deprecated: it is now server.combine.rule (set to 'trimmed_mean')" in err
    assert "note: train.reject_norm_factor is deprecated: it is now server.screen.norm_factor" in err
    cfg = build_config({}, {"server": {"combine": {"rule": "trimmed_mean", "fraction": 0.2}, "min_clients": 3,
                                       "screen": {"norm_factor": None}}})
    assert "combine:\n    rule: trimmed_mean\n    bucket: 1\n    fraction: 0.2" in out and cfg.server.min_clients == 3
    with pytest.raises(ConfigError, match="train.aggregator = 'median' and server.combine.rule = 'krum' are both set"):
        build_config({"train": {"aggregator": "median"}, "server": {"combine": {"rule": "krum"}}})


def test_a_run_directory_written_before_the_chain_reads_without_notes(tmp_path):
    """A saved config.yaml of the main before #46 lists every train key, the robust ones included."""
    import yaml

    old = {"train": {"rounds": 3, "aggregator": "mean", "trim_fraction": 0.1, "byzantine_fraction": 0.1,
                     "multi_krum_keep": None, "multi_krum_weighted": False, "reject_norm_factor": 10.0,
                     "norm_reference_clients": 32, "min_clients": 1},
           "methods": [{"name": "a", "algorithm": "fedavg"},
                       {"name": "b", "algorithm": "fedavg", "train": {"aggregator": "trimmed_mean",
                                                                      "trim_fraction": 0.3}}]}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cfg = load_run_config(tmp_path / "config.yaml")
    assert not [w for w in caught if issubclass(w.category, HetfedNote)]
    assert cfg.server.combine.shown() == {} and cfg.server.screen.norm_factor == 10.0  # the default: mean
    assert cfg.method_server(cfg.methods[1]).combine.shown() == {"rule": "trimmed_mean", "fraction": 0.3}
    assert migrate_legacy(old)["train"] == {"rounds": 3}


def test_a_checkpoint_written_before_the_chain_resumes_with_its_optimiser_state():
    chain = server_chain(ServerConfig(optimizer={"kind": "avgm", "lr": 0.5, "momentum": 0.9}))
    momentum = {"t": 3, "v": {"w": torch.tensor([1.0])}}
    assert chain.state_of({"server_optimizer": momentum}) == {"optimizer": momentum}
    up = Upload([0], {"w": torch.tensor([[2.0]])}, torch.tensor([1.0]))
    new, state = chain.step({"w": torch.tensor([0.0])}, up, chain.state_of({"server_optimizer": momentum}))
    # v ← 0.9·1 + (2 − 0) = 2.9; x ← 0 + 0.5·2.9
    assert new["w"].item() == pytest.approx(1.45) and state["optimizer"]["t"] == 4


def test_a_plugin_module_registers_a_combine_rule_the_config_can_name(tmp_path):
    """``plugins:`` are imported before any section is validated, so a rule they register is known to
    ``server.combine`` (and to every Flower node, which imports them from the same config)."""
    from hetfed.runs.runner import run_experiment

    raw = {"plugins": ["tests.plugin_combine_rule"], "partition": {"clients": 4},
           "train": {"rounds": 2, "local_steps": 2}, "methods": [{"algorithm": "fedavg"}],
           "server": {"combine": {"rule": "plugin_clipped_mean", "bound": 0.01}}}
    summary = run_experiment(build_config(raw), out=tmp_path / "r", progress=False).summary
    assert summary["methods"]["fedavg"]["final"]["global_accuracy"] is not None
    with pytest.raises(ConfigError, match=r"unknown key 'server.combine.bund' = 1: did you mean 'server.combine.bound'"
                                          r"\? combine rule 'plugin_clipped_mean' takes \['bound'\]"):
        build_config({**raw, "server": {"combine": {"rule": "plugin_clipped_mean", "bund": 1}}})


def test_components_lists_every_registered_kind_with_parameters_and_refuses_an_unknown_kind(capsys, toy_rule):
    import json

    from hetfed.algorithms import registry
    from hetfed.cli import main

    assert main(["components", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    from hetfed.registry import KINDS

    assert set(listed) == set(KINDS) and all(listed[k]["components"] for k in KINDS)  # every kind, none empty
    executors = {c["name"]: c for c in listed["executor"]["components"]}
    assert {"vectorised", "sequential", "flower", "deployment"} <= set(executors)
    assert executors["vectorised"]["in_process"] and not executors["flower"]["in_process"]
    assert not executors["deployment"]["selectable"]
    parts = {c["name"]: c for c in listed["partitioner"]["components"]}
    assert {"iid", "shards", "majority", "dirichlet", "feature_clusters", "natural"} <= set(parts)
    assert parts["natural"]["ordered"] and not parts["iid"]["ordered"]
    assert {c["name"] for c in listed["algorithm"]["components"]} == set(registry.names())
    combine = {c["name"]: c for c in listed["combine"]["components"]}
    # every registered rule, a test's toy (and a plugin's, when that test ran in this process) included
    assert {"mean", "median", "trimmed_mean", "krum", "multi_krum", toy_rule} <= set(combine) == set(rules.names())
    assert combine["trimmed_mean"]["params"] == [{"name": "fraction", "default": 0.1, "type": "float",
                                                  "bounds": {"ge": 0, "lt": 0.5},
                                                  "description": "share cut from each end per coordinate"}]
    assert combine["mean"]["streams"] and not combine["median"]["streams"]
    assert combine["fltrust"]["root"] and not combine["mean"]["root"]
    assert main(["components", "combine", "fltrust"]) == 0
    assert "trains on a labelled root set (a server_data holdout)" in capsys.readouterr().out
    assert {c["name"]: c["default_lr"] for c in listed["optimizer"]["components"]} == {
        "sgd": 1.0, "avgm": 1.0, "adagrad": 0.01, "adam": 0.01, "yogi": 0.01}
    assert main(["components", "datasets"]) == 2
    assert f"component kind 'datasets' is not allowed: expected one of {sorted(KINDS)}" in capsys.readouterr().err


def test_a_plugin_module_registers_a_partitioner_with_a_parameter_of_its_own(tmp_path, capsys):
    """#46, #73: a toy partitioner in a plugin, one file with its own parameter, named by partition.kind and run end
    to end; its parameter is applied, listed by `hetfed components`, and a key it does not take is refused."""
    from hetfed.cli import main

    out = tmp_path / "r"
    plugin = ["--set", "plugins=[tests.plugin_partitioner]", "--set", "partition.kind=plugin_label_parity"]
    assert main(["run", *plugin, "--set", "partition.odd_share=0.75", "--set", "partition.clients=4",
                 "--set", "train.rounds=1", "--set", "train.local_steps=2", "--out", str(out), "--quiet"]) == 0
    import numpy as np

    with np.load(out / "federation.npz") as z:  # the run's own record of who holds which classes
        counts = z["counts"]
    odd = [bool(row[1::2].sum()) for row in counts]
    assert odd == [False, True, True, True]  # 3 of 4 clients hold the odd labels: odd_share 0.75 was applied
    assert all(not (row[0::2].sum() and row[1::2].sum()) for row in counts)  # one parity each
    capsys.readouterr()
    assert main(["config", *plugin, "--set", "partition.alpha=0.1"]) == 2
    assert ("unknown key 'partition.alpha' = 0.1: did you mean 'alpha' of partitioner 'dirichlet'? partitioner "
            "'plugin_label_parity' takes ['odd_share']"
            in capsys.readouterr().err)


def test_a_plugin_module_registers_a_dataset_with_a_parameter_of_its_own(tmp_path):
    """#46, #73: a toy dataset in a plugin, one file with its own parameter, named by dataset.name and run end to
    end."""
    import json

    from hetfed.cli import main

    out = tmp_path / "r"
    assert main(["run", "--set", "plugins=[tests.plugin_dataset]", "--set", "dataset.name=plugin_blobs",
                 "--set", "dataset.centers=4", "--set", "partition.clients=3", "--set", "train.rounds=2",
                 "--out", str(out), "--quiet"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["dataset"] == "plugin_blobs" and summary["n_classes"] == 4 and summary["input_shape"] == [5]
    assert summary["methods"]["relu"]["best"]["global_accuracy"] > 0.5  # four well-separated blobs


def test_a_plugin_module_registers_a_model_with_a_parameter_of_its_own(tmp_path):
    """#73: a toy model in a plugin, one file with its own parameter, named by model.kind: the parameter reaches
    its build (the checkpoint's weights have its width)."""
    import torch

    from hetfed.cli import main

    out = tmp_path / "r"
    assert main(["run", "--set", "plugins=[tests.plugin_model]", "--set", "model.kind=plugin_wide",
                 "--set", "model.width=12", "--set", "partition.clients=3", "--set", "train.rounds=1",
                 "--set", "methods=[{algorithm: fedavg}]", "--out", str(out), "--quiet"]) == 0
    state = torch.load(next((out / "checkpoints").glob("**/*.pt")), weights_only=False)
    shapes = [tuple(v.shape) for v in _tensors(state)]
    assert (12, 64) in shapes or (64, 12) in shapes, shapes


def _tensors(tree):
    import torch

    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, dict):
        for v in tree.values():
            yield from _tensors(v)
    elif isinstance(tree, list | tuple):
        for v in tree:
            yield from _tensors(v)


def test_a_plugin_module_registers_an_executor_the_driver_opens_around_its_methods(tmp_path):
    """#46: a toy executor in a plugin, one file, named by train.executor: the driver opens it (a context
    manager) once around the methods on it, its clients compute every update, and the numbers are the
    vectorised executor's (it is one underneath)."""
    from hetfed.cli import main
    from tests.plugin_executor import EVENTS

    EVENTS.clear()
    common = ["--set", "train.rounds=2", "--set", "partition.clients=4", "--quiet"]
    assert main(["run", "--set", "plugins=[tests.plugin_executor]", "--set", "train.executor=plugin_counting",
                 *common, "--out", str(tmp_path / "plugin")]) == 0
    assert EVENTS[0] == ("open", 4) and EVENTS[-1] == ("close", None)
    trained = [n for what, n in EVENTS if what == "train"]
    assert len(trained) == 2 * 2 and all(n == 4 for n in trained)  # two methods × two rounds, every client
    assert [e for e in EVENTS if e[0] == "open"] == [("open", 4)]  # one session for both methods
    assert main(["run", *common, "--out", str(tmp_path / "vectorised")]) == 0
    assert (tmp_path / "plugin" / "metrics.csv").read_bytes() == (tmp_path / "vectorised" / "metrics.csv").read_bytes()


@pytest.mark.parametrize(("server", "privacy", "stages"), [
    ({}, None, ("screen", "combine", "rescale", "optimizer")),
    ({"compression": {"kind": "qsgd", "bits": 4}}, None, ("decode", "screen", "combine", "rescale", "optimizer")),
    ({}, {"noise_multiplier": 0.5, "clip": 1.0}, ("screen", "clip", "combine", "rescale", "optimizer")),
])
def test_the_chain_names_its_stages_in_the_order_a_rounds_updates_go_through_them(server, privacy, stages):
    from hetfed.config import PrivacyConfig, ServerConfig
    from hetfed.server.pipeline import server_chain

    chain = server_chain(ServerConfig(**server), PrivacyConfig(**privacy) if privacy else None)
    assert chain.stages() == stages
    assert (chain.private is not None) == (privacy is not None)
    assert chain.norm_factor() == (None if privacy else 10.0)  # DP's clip bounds every update: no norm filter


def test_the_chain_receives_a_round_screening_and_clipping_as_configured():
    """The receiving side the executors feed: non-finite updates and (with the filter on) outliers out, each update
    clipped under DP, the rejections counted."""
    import torch

    from hetfed.config import PrivacyConfig, ServerConfig
    from hetfed.engine.types import Upload
    from hetfed.server.pipeline import server_chain

    ref = {"w": torch.zeros(3)}
    deltas = torch.tensor([[1.0, 0, 0], [0, 1.0, 0], [0, 0, 1.0], [50.0, 0, 0], [float("nan"), 0, 0]])
    upload = Upload(list(range(5)), {"w": deltas}, torch.ones(5), {})
    plain = server_chain(ServerConfig()).receiving(ref)
    plain.add(upload)
    got = plain.result()
    assert got.client_ids == [0, 1, 2] and got.screened == {"rejected_nonfinite": 1, "rejected_norm": 1}
    private = server_chain(ServerConfig(), PrivacyConfig(noise_multiplier=0.5, clip=2.0)).receiving(ref, stream=False)
    private.add(upload)
    got = private.result()
    assert got.client_ids == [0, 1, 2, 3]  # no norm filter under DP: the outlier is clipped instead
    assert torch.allclose(got.params["w"][3], torch.tensor([2.0, 0, 0]))


@pytest.mark.parametrize(("server", "privacy"), [
    ({}, None),
    ({"optimizer": {"kind": "adam", "lr": 0.1}}, None),
    ({"optimizer": {"kind": "avgm", "lr": 0.5}}, None),
    ({"combine": {"rule": "trimmed_mean", "fraction": 0.2}}, None),
    ({"combine": {"rule": "krum", "byzantine_fraction": 0.2}}, None),
    ({"combine": {"rule": "median", "bucket": 2}}, None),
    ({"combine": {"rule": "centered_clipping"}}, None),
    ({}, {"noise_multiplier": 0.5, "clip": 1.0}),
])
def test_a_chain_steps_several_runs_in_one_call_with_each_runs_numbers_alone(server, privacy):
    """#74 item 1: :meth:`Chain.step_runs` (a stacked sweep's runs of one chain, its mean in one call) gives every
    run the model and chain state its own :meth:`Chain.step` gives it — to the bit, over three rounds, for runs whose
    uploads differ in their clients, counts and values (one run's a single update, one's reduced)."""
    from hetfed.config import PrivacyConfig, ServerConfig
    from hetfed.engine.types import StreamedUpload
    from hetfed.server.chain import Round

    chain = server_chain(ServerConfig(**server), PrivacyConfig(**privacy) if privacy else None)
    gen = torch.Generator().manual_seed(7)

    def upload(n: int, reduced: bool = False) -> Upload:
        rows = {"w": torch.randn(n, 3, 2, generator=gen), "b": torch.randn(n, 5, generator=gen)}
        counts = torch.randint(1, 40, (n,), generator=gen).float()
        if reduced:
            return StreamedUpload(list(range(n)), {}, counts, {}, {}, {k: v.mean(0) for k, v in rows.items()})
        return Upload(list(range(n)), rows, counts, {})

    params = [{"w": torch.randn(3, 2, generator=gen), "b": torch.randn(5, generator=gen)} for _ in range(4)]
    alone, together = [dict(p) for p in params], [dict(p) for p in params]
    states_alone: list[dict] = [{} for _ in params]
    states_together: list[dict] = [{} for _ in params]
    for rnd in range(3):
        plain_mean = server.get("combine", {}).get("rule", "mean") == "mean" and not privacy
        shapes = [6, 6, 1, 4] if plain_mean else [6, 6, 5, 7]
        uploads = [upload(n, reduced=i == 3 and plain_mean) for i, n in enumerate(shapes)]
        for i, u in enumerate(uploads):
            alone[i], states_alone[i] = chain.step(alone[i], u, states_alone[i], round=rnd, seed=i,
                                                   expected_clients=6)
        rounds = [Round(p, u, None, rnd, i, 6) for i, (p, u) in enumerate(zip(together, uploads, strict=True))]
        stepped = chain.step_runs(rounds, states_together)
        together, states_together = [p for p, _ in stepped], [s for _, s in stepped]
        for a, b, sa, sb in zip(alone, together, states_alone, states_together, strict=True):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
            _same(sa, sb)


def _same(a, b) -> None:
    """Two chain states equal: the same keys and values, tensors to the bit."""
    assert type(a) is type(b)
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _same(a[k], b[k])
    elif isinstance(a, list | tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        assert a == b
