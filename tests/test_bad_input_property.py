"""The README's promise, checked over generated input: any malformed config or
``arrays`` file ends in exit 0 or in exit 2 with one line that starts ``error:``
— never a traceback."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetfed.cli import main

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
