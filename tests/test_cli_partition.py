import json

import pytest

from hetfed.cli import main
from hetfed.config import load_config
from hetfed.errors import ConfigError


def test_partition_default_json(capsys):
    assert main(["partition", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["dataset"] == "digits" and out["partition"]["kind"] == "feature_clusters"
    assert len(out["clients"]) == 10 and out["gamma"] > 0
    assert all("size" in c and len(c["class_counts"]) == 10 for c in out["clients"])
    assert sum(c["size"] for c in out["clients"]) == 1437


def test_partition_says_and_records_what_loading_did(capsys):
    """The loading note a run records as ``data_notes`` (here: the classes kept) is in ``hetfed partition --json``'s
    report and on its stderr, as a run says it — the JSON on stdout stays JSON."""
    assert main(["partition", "--json", "--set", "dataset.keep_classes=[3, 8]", "--set", "partition.kind=iid",
                 "--set", "partition.clients=3"]) == 0
    said = capsys.readouterr()
    notes = json.loads(said.out)["data_notes"]
    assert len(notes) == 1 and notes[0].startswith("classes [3, 8] kept as 0..1") and notes[0] in said.err


def test_partition_table_and_plot(tmp_path, capsys):
    fig = tmp_path / "p.png"
    assert main(["partition", "--set", "partition.kind=dirichlet", "--set", "partition.alpha=0.3",
                 "--set", "partition.opt_out=0.5", "--plot", str(fig)]) == 0
    out = capsys.readouterr().out
    assert "Γ" in out and "yes" in out
    assert fig.stat().st_size > 1000


def test_gamma_falls_with_shuffle(capsys):
    gammas = []
    for s in (0.0, 0.5, 1.0):
        main(["partition", "--json", "--set", f"partition.shuffle={s}"])
        gammas.append(json.loads(capsys.readouterr().out)["gamma"])
    assert gammas[0] > gammas[1] > gammas[2]


@pytest.mark.parametrize(
    "override, expected",
    [
        ("dataset.name=imagenet", "dataset.name"),
        ("partition.kind=random", "partition.kind"),
        ("partition.alpha=0", "partition.alpha"),
        ("partition.p=1.5", "partition.p"),
        ("partition.shuffle=-0.1", "partition.shuffle"),
        ("partition.opt_out=2", "partition.opt_out"),
        ("partition.clients=5000", "partition.clients = 5000"),
        ("partition.shufle=0.1", "unknown key 'partition.shufle'"),
        ("dataset.name=cifar10", "looked in"),
        ("dataset.data_dir=/nowhere", ""),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(override, expected, capsys, monkeypatch):
    from hetfed.registry import registry_of

    monkeypatch.setattr(registry_of("dataset").get("mnist"), "places", ())
    if expected == "":  # data_dir is only read for file-based datasets: digits still works
        assert main(["partition", "--json", "--set", override]) == 0
        return
    assert main(["partition", "--set", override]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err


def test_config_errors_name_key_and_value():
    with pytest.raises(ConfigError, match=r"partition.p = 1.5"):
        load_config(None, ["partition.kind=majority", "partition.p=1.5"])
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent.yaml")
    with pytest.raises(ConfigError, match="key=value"):
        load_config(None, ["seed"])


def test_yaml_file_and_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("seed: 3\npartition:\n  kind: iid\n  clients: 4\n")
    cfg = load_config(path, ["partition.clients=6"])
    assert cfg.seed == 3 and cfg.partition.kind == "iid" and cfg.partition.clients == 6
