from pathlib import Path

import pytest

from hetfed.config import Config, load_config

CONFIG_DIR = Path(__file__).parent.parent / "configs"
CONFIGS = sorted(CONFIG_DIR.rglob("*.yaml"))  # configs/paper/ too


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.relative_to(CONFIG_DIR).as_posix())
def test_every_shipped_config_validates(path):
    load_config(path)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.relative_to(CONFIG_DIR).as_posix())
def test_a_run_directorys_config_is_written_as_pyyamls_own_emitter_writes_it_and_reads_back_as_the_config(path):
    """dump_config writes with libyaml's emitter where PyYAML has it (5× faster): the same text as PyYAML's own,
    read back (``hetfed run --resume``) as the same config — for every shipped config, and with a string of every
    kind a user may type (quotes, colons, non-ASCII, a line break)."""
    import yaml

    from hetfed.config import build_config, dump_config, effective_methods, read_yaml

    config = load_config(path)
    text = dump_config(config)
    assert text == yaml.dump(config.model_dump(mode="json"), Dumper=yaml.SafeDumper, sort_keys=False) + \
        effective_methods(config)
    odd = build_config({**read_yaml(path), "name": "a: 'b' \"c\" – é\nd #e"})
    assert dump_config(odd) == yaml.dump(odd.model_dump(mode="json"), Dumper=yaml.SafeDumper, sort_keys=False) + \
        effective_methods(odd)
    assert build_config(yaml.safe_load(dump_config(odd))).model_dump() == odd.model_dump()


def test_default_config_file_is_the_builtin_default():
    """`hetfed run` with no arguments and configs/default.yaml are the same job."""
    from_file = load_config(Path(__file__).parent.parent / "configs" / "default.yaml")
    assert from_file.model_dump() == Config().model_dump()


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.relative_to(CONFIG_DIR).as_posix())
def test_every_shipped_config_passes_the_checks_between_components_and_has_no_deprecated_key(path):
    """Each shipped config is written in today's keys (no note) and would be planned (hetfed.runs.plan)."""
    import warnings

    from hetfed.errors import HetfedNote
    from hetfed.runs.plan import check_config

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_config(load_config(path))
    assert not [str(w.message) for w in caught if issubclass(w.category, HetfedNote)]


def test_validating_a_config_imports_only_the_components_it_names():
    """#73: each registry imports the module named after the chosen component, not every component of the kind."""
    import subprocess
    import sys

    code = ("import sys\nfrom hetfed.config import build_config\nbuild_config()\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('hetfed.'))))")
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
                 .stdout.split())
    components = {m for m in loaded if m.rsplit(".", 1)[0] in (
        "hetfed.algorithms", "hetfed.partition", "hetfed.models.kinds", "hetfed.data.datasets",
        "hetfed.data.embeddings", "hetfed.server.optimizers", "hetfed.server.combine", "hetfed.server.compression")}
    assert components == {
        "hetfed.algorithms.build", "hetfed.algorithms.fedavg", "hetfed.algorithms.registry",
        "hetfed.partition.feature_clusters", "hetfed.models.kinds.mlp", "hetfed.models.kinds.cgau",
        "hetfed.data.datasets.digits", "hetfed.data.embeddings.identity", "hetfed.server.optimizers.sgd",
        "hetfed.server.combine.mean", "hetfed.server.compression.none"}, sorted(components)
    assert not any(m.startswith("hetfed.flower") for m in loaded)


def test_a_run_directory_written_before_components_owned_their_parameters_still_opens(tmp_path):
    """An older hetfed wrote every component's keys in one flat section and the server optimiser's beside the
    others: read back, each section keeps what its component takes, the optimiser's keys move into its block."""
    import yaml

    from hetfed.config import load_run_config

    old = {"partition": {"kind": "dirichlet", "clients": 6, "alpha": 0.2, "min_size": 5, "shuffle": 0.0, "p": 0.8,
                         "pca_components": 2, "natural_min_samples": 1},
           "model": {"kind": "mlp", "hidden": [32], "dropout": 0.1, "batch_norm": False, "lstm_layers": 2},
           "embed": {"kind": "identity", "components": 32, "image_size": 224, "batch_size": 64},
           "dataset": {"name": "digits", "plays": None, "categories": None, "path": None},
           "train": {"rounds": 2, "clock": {"latency": "constant", "spread": 1.0, "file": None,
                                            "sample_seconds": 0.002}},
           "attack": {"kind": "scale", "fraction": 0.2, "factor": None, "noise_std": 1.0},
           "server": {"optimizer": "adam", "lr": 0.02, "momentum": 0.9, "beta1": 0.8, "beta2": 0.99, "tau": 0.001,
                      "bias_correction": False, "variant": "paper"},
           "methods": [{"name": "a", "algorithm": "fedavg"},
                       {"name": "b", "algorithm": "fedavg", "model": {"kind": "cnn4", "batch_norm": True},
                        "server": {"optimizer": "avgm", "momentum": 0.5}}]}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(old))
    config = load_run_config(path)
    assert config.partition.params.model_dump() == {"alpha": 0.2, "min_size": 5, "samples_per_client": None}
    assert config.train.clock.latency == "constant" and config.train.clock.sample_seconds == 0.002
    assert config.attack.params.factor == 10.0  # None was "the kind's default" then
    assert config.model.params.model_dump() == {"hidden": [32], "dropout": 0.1}
    assert config.server.optimizer.kind == "adam" and config.server.optimizer.lr == 0.02
    assert config.server.optimizer.params.beta1 == 0.8
    b = config.methods[1]
    assert config.method_model(b).params.model_dump() == {"batch_norm": True}
    assert config.method_server(b).optimizer.kind == "avgm" and config.method_server(b).optimizer.params.momentum == 0.5
