"""The plan step's checks between components (hetfed.runs.plan.check_config): each names both keys, and runs
before any data is loaded."""

from __future__ import annotations

import pytest

from hetfed.config import build_config
from hetfed.errors import ConfigError
from hetfed.runs.plan import check_config


@pytest.mark.parametrize(("raw", "needle"), [
    ({"server_data": {"source": "dataset", "name": "mnist"}, "embed": {"kind": "pca"},
      "methods": [{"algorithm": "feddf"}]},
     "server_data.source = 'dataset' is not allowed with embed.kind = 'pca': it is fitted on the federation's data"),
    ({"server": {"compression": {"kind": "qsgd", "bits": 4}}, "methods": [{"algorithm": "local"}]},
     "server.compression = {'kind': 'qsgd', 'bits': 4} is not allowed with methods.0.algorithm = 'local'"),
    ({"dataset": {"name": "nodes", "features": 4, "classes": [0, 1]}, "partition": {"kind": "natural"}},
     "dataset.name = 'nodes' needs flower.nodes"),
    ({"dataset": {"name": "nodes", "features": 4, "classes": [0, 1]}, "partition": {"feature_noise": 0.5},
      "flower": {"nodes": 2}},
     "partition.feature_noise = 0.5 is not allowed with dataset.name = 'nodes': the nodes' own data is not simulated"),
    ({"dataset": {"name": "nodes", "features": 4, "classes": [0, 1]}, "partition": {"label_swaps": [None, [0, 1]]},
      "flower": {"nodes": 2}},
     "partition.label_swaps = [None, [0, 1]] is not allowed with dataset.name = 'nodes': the nodes' own data is not"),
    ({"dataset": {"name": "nodes", "features": 4, "classes": [0, 1], "positive_class": 1}, "flower": {"nodes": 2}},
     "dataset.positive_class = 1 is not allowed with dataset.name = 'nodes': each node reads its own file as it is"),
    ({"dataset": {"name": "nodes", "features": 4, "classes": [0, 1, 2], "keep_classes": [0, 2]},
      "flower": {"nodes": 2}},
     "dataset.keep_classes = [0, 2] is not allowed with dataset.name = 'nodes': each node reads its own file"),
    ({"dataset": {"name": "nodes", "features": 4, "classes": [0, 1], "standardise": "global"},
      "flower": {"nodes": 2}},
     "dataset.standardise = 'global' is not allowed with dataset.name = 'nodes'"),
    ({"server_data": {"source": "none"}, "methods": [{"algorithm": "feddf"}]},
     "server_data.source = 'none' is not allowed with methods.0.algorithm = 'feddf'"),
    ({"model": {"kind": "charlstm"}, "methods": [{"algorithm": "fedavg"}]},
     "methods.0 model.kind = 'charlstm' with embed.kind = 'identity' is not allowed"),
])
def test_components_that_do_not_go_together_are_refused_naming_both(raw, needle):
    config = build_config(raw)  # each section on its own is valid
    with pytest.raises(ConfigError, match="^" + needle.replace("(", r"\(").replace("[", r"\[").replace("{", r"\{")):
        check_config(config)


def test_a_command_that_trains_nothing_skips_the_model_checks_only():
    config = build_config({"model": {"kind": "charlstm"}, "methods": [{"algorithm": "fedavg"}]})
    check_config(config, train=False)  # hetfed partition
    nodes = build_config({"dataset": {"name": "nodes", "features": 4, "classes": [0, 1]}})
    with pytest.raises(ConfigError, match="needs flower.nodes"):
        check_config(nodes, train=False)


def test_hetfed_run_refuses_them_before_loading_any_data(tmp_path, capsys, monkeypatch):
    from hetfed.cli import main
    from hetfed.runs import runner

    monkeypatch.setattr(runner, "prepare", lambda *a, **k: pytest.fail("data loaded before the plan's checks"))
    out = tmp_path / "r"
    assert main(["run", "--set", "model.kind=charlstm", "--out", str(out)]) == 2
    assert "model.kind = 'charlstm' with embed.kind = 'identity' is not allowed" in capsys.readouterr().err
    assert not out.exists()
