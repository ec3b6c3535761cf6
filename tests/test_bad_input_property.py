"""The README's promise, checked over generated input: any malformed config or
``arrays`` file ends in exit 0 or in exit 2 with one line that starts ``error:``
— never a traceback."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetfed.cli import main
from hetfed.config import section_keys

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

KEYS = ["seed", "name", "dataset", "dataset.name", "dataset.test_fraction", "dataset.positive_class", "embed.kind",
        "embed.components", "partition", "partition.kind", "partition.clients", "partition.shuffle", "partition.alpha",
        "partition.p", "partition.opt_out", "partition.val_fraction", "partition.test_fraction", "model.kind",
        "model.hidden", "model.dropout", "train.rounds", "train.client_fraction", "train.clients_per_round",
        "train.optimizer.lr", "train.optimizer.kind", "train.batch_size", "train.executor", "methods",
        "methods.0.algorithm", "methods.0.model", "methods.0.params", "methods.0.params.mu", "server.optimizer",
        "server.optimizer.kind", "server.optimizer.lr", "server.optimizer.beta1",
        "server.lr", "moe", "fsnet.hidden", "typo", "train.typo"]
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8), st.lists(st.integers(-3, 5), max_size=3),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)


def _nest(items: dict[str, object]) -> dict:
    out: dict = {}
    for key, value in items.items():
        node = out
        parts = key.split(".")
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = value
    return out


def _check(code: int, err: str) -> None:
    assert "Traceback" not in err
    if code != 0:
        assert code == 2, err
        assert len([ln for ln in err.splitlines() if ln.startswith("error:")]) == 1, err


@SETTINGS
@given(items=st.dictionaries(st.sampled_from(KEYS), VALUES, min_size=1, max_size=4))
def test_malformed_configs_get_exit_2_and_one_line(items, capsys):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.yaml"
        path.write_text(yaml.safe_dump(_nest(items)))
        code = main(["config", str(path)])
        _check(code, capsys.readouterr().err)


@SETTINGS
@given(
    n=st.integers(0, 40),
    d=st.integers(1, 4),
    classes=st.integers(1, 4),
    dtype=st.sampled_from(["float64", "float32", "int64", "uint8", "bool", "str"]),
    label_dtype=st.sampled_from(["int64", "float64", "str", "bool"]),
    poison=st.sampled_from([None, np.nan, np.inf, -np.inf, 1e300, -1e40]),
    with_split=st.booleans(),
    label_offset=st.floats(0, 1),
)
def test_malformed_arrays_files_get_exit_2_and_one_line(n, d, classes, dtype, label_dtype, poison, with_split,
                                                        label_offset, capsys):
    rng = np.random.default_rng(n * 7 + d)
    x = rng.normal(size=(n, d)) * 3
    if poison is not None and n:
        x[rng.integers(n), rng.integers(d)] = poison
    x = x.astype(str) if dtype == "str" else x.astype(dtype) if np.all(np.isfinite(x)) or "float" in dtype else x
    y = (np.arange(n) % classes).astype(float) + (label_offset if label_dtype == "float64" else 0)
    y = y.astype(label_dtype) if label_dtype != "str" else y.astype(str)
    arrays = {"x": x, "y": y}
    if with_split and n:
        arrays["split"] = np.where(np.arange(n) % 4 == 0, "test", "train")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "d.npz"
        np.savez(path, **arrays)
        code = main(["partition", "--set", "dataset.name=arrays", "--set", f"dataset.path={path}",
                     "--set", "partition.kind=iid", "--set", "partition.clients=2", "--set", "partition.min_size=1",
                     "--json"])
        _check(code, capsys.readouterr().err)


# ------------------------------------------------------------------ a mistyped key is answered with the fix

@pytest.mark.parametrize("typed,says", [
    ("train.round=3", "unknown key 'train.round' = 3: did you mean 'train.rounds'? section 'train' takes ["),
    ("train.lr=0.1", "unknown key 'train.lr' = 0.1: did you mean 'train.optimizer.lr' or 'server.optimizer.lr'?"),
    ("trian.rounds=1", "unknown key 'trian' = {'rounds': 1}: did you mean 'train'? a config takes ['attack',"),
    ("methods.0.trian.rounds=1", "unknown key 'methods.0.trian' = {'rounds': 1}: did you mean 'methods.0.train'? "
                                 "section 'methods.0' takes ['algorithm', 'model', 'name', 'params', 'server', "
                                 "'train']"),
    ("flower.nodez=2", "unknown key 'flower.nodez' = 2: did you mean 'flower.nodes'?"),
    ("server.optimizer.lrr=1", "unknown key 'server.optimizer.lrr' = 1: did you mean 'server.optimizer.lr'?"),
    ("methods.1.model.hiden=[3]", "unknown key 'methods.1.model.hiden' = [3]: did you mean 'methods.1.model.hidden'? "
                                  "model 'cgau' takes ['condition_output', 'dropout', 'hidden']"),
    ("model.hiden=[3]", "model.hiden = [3] is not allowed: did you mean 'model.hidden'?"),
    ("methods.0.params.mu=0.1", "unknown key 'methods.0.params.mu' = 0.1: did you mean 'mu' of algorithm 'fedprox'? "
                                "algorithm 'fedavg' has no parameters of its own"),
])
def test_a_mistyped_key_is_told_the_key_it_meant_and_what_its_section_takes(capsys, typed, says):
    assert main(["config", "--set", typed]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and says in err, err


@pytest.mark.parametrize("typed,says", [
    ("train.executor=vectorized", "train.executor = 'vectorized': not allowed: did you mean 'vectorised'? expected one "
                                  "of ['flower', "),
    ("server.optimizer.kind=adm", "server.optimizer.kind = 'adm' is not allowed: did you mean 'adam'?"),
    ("methods.1.server.optimizer.kind=adm", "methods.1.server.optimizer.kind = 'adm' is not allowed: did you mean "
                                            "'adam'?"),  # a method's own key named as such
    ("methods.0.train.rounds=x", "error: invalid config: methods.0.train.rounds = 'x': Input should be a valid "
                                 "integer"),  # in full, not "in methods.0.train: rounds = 'x'"
    ("methods.0.model.kind=mpl", "methods.0.model.kind = 'mpl' is not allowed: did you mean 'mlp'? expected one of "
                                 "['bilstm',"),
    ("methods.0.algorithm=fedsgd", "methods.0.algorithm = 'fedsgd' is not allowed: expected one of"),  # no feddf
    ("methods.0.algorithm=fedprx", "methods.0.algorithm = 'fedprx' is not allowed: did you mean 'fedprox'?"),
    ("train.optimizer.kind=sdg", "train.optimizer.kind = 'sdg': did you mean 'sgd'? Input should be 'sgd', 'adam' or "
                                  "'adamw'"),
    ("train.device=cdua", "train.device = 'cdua': did you mean 'cuda'? Input should be"),
    ("train.device=gpu", "train.device = 'gpu': Input should be 'auto', 'cpu' or 'cuda'"),  # not a typo of 'cpu'
])
def test_a_mistyped_choice_is_told_the_choice_it_meant_and_every_choice(capsys, typed, says):
    assert main(["config", "--set", typed]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and says in err, err


@pytest.mark.parametrize("typed,says", [
    (["partition.kind=shards", "partition.shard_cut=sortd"], "partition.shard_cut = 'sortd': did you mean 'sorted'? "
                                                             "Input should be 'within_class' or 'sorted'"),
    (["partition.kind=pathological", "partition.assignment=firstdeterministic"],
     "partition.assignment = 'firstdeterministic': did you mean 'first-deterministic'?"),
    (["methods=[{algorithm: fedmoe, params: {blend: lgo}}]"], "methods.0.params.blend = 'lgo': did you mean 'log'? "),
])
def test_a_mistyped_choice_among_a_components_parameters_is_told_the_choice_it_meant(capsys, typed, says):
    """A partitioner's or an algorithm's own choices are answered as the config's sections' are."""
    assert main(["config", *(a for key in typed for a in ("--set", key))]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and says in err, err


def test_an_error_in_a_config_file_names_the_file_and_whether_overrides_went_onto_it(capsys, tmp_path):
    """The key alone does not say where it was typed: a file's error names the file (the CLI and the API alike)."""
    import hetfed

    path = tmp_path / "mine.yaml"
    path.write_text("train:\n  round: 3\n")
    for argv, says in [([str(path)], f"error: invalid config (file {str(path)!r}): unknown key 'train.round' = 3"),
                       ([str(path), "--set", "seed=1"], f"error: invalid config (file {str(path)!r} with overrides): "),
                       (["--set", "train.round=3"], "error: invalid config: unknown key 'train.round' = 3")]:
        assert main(["config", *argv]) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and err.startswith(says), err
    with pytest.raises(hetfed.ConfigError, match=re.escape(f"invalid config (file {str(path)!r}): unknown key")):
        hetfed.load_config(path)
    with pytest.raises(hetfed.ConfigError, match=re.escape("invalid config: unknown key")):
        hetfed.load_config({"train": {"round": 3}})


#: every dotted key of the config's sections (not a component's own parameters, nor methods.N)
CONFIG_KEYS = list(section_keys())


@SETTINGS
@given(key=st.sampled_from([k for k in CONFIG_KEYS if len(k.rpartition(".")[2]) >= 4]), data=st.data())
def test_a_key_with_one_letter_wrong_is_refused_with_a_key_the_config_has_suggested(key, data):
    from hetfed.config import build_config
    from hetfed.errors import ConfigError

    parent, _, leaf = key.rpartition(".")
    i = data.draw(st.integers(0, len(leaf) - 1))
    typo_leaf = data.draw(st.sampled_from([leaf[:i] + leaf[i + 1:], leaf[:i] + "q" + leaf[i:],
                                           leaf[:i] + "q" + leaf[i + 1:]]))
    typo = f"{parent}.{typo_leaf}" if parent else typo_leaf
    if typo in CONFIG_KEYS:
        return  # the typo is another key
    with pytest.raises(ConfigError) as err:
        build_config(overrides={typo: 1})
    message = str(err.value)
    # (a key of the methods' default model: no method's model takes it, said its own way)
    assert "\n" not in message and (f"unknown key {typo!r} = 1: " in message
                                    or f"{typo} = 1 is not allowed: " in message), message
    assert i == 0 or "did you mean" in message, message  # a typo past the first letter is always answered
    for suggested in re.findall(r"did you mean ((?:'[\w.]+'(?: or )?)+)\?", message):
        assert all(s in CONFIG_KEYS for s in re.findall(r"'([\w.]+)'", suggested)), message
