"""docs/methods.md's privacy table says what every method's upload holds; check it against the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from hetfed.algorithms import algorithm_for
from hetfed.config import build_config
from hetfed.engine.rng import CLIENT_INIT, SERVER_INIT, torch_gen
from hetfed.engine.types import stack_states
from hetfed.executors.inprocess import Pool, client_data
from hetfed.pipeline import prepare

DOC = Path(__file__).resolve().parents[2] / "docs" / "methods.md"


def table_rows() -> list[dict]:
    """The rows of the Upload table: config column and the backticked Upload.extra fields."""
    lines = DOC.read_text().splitlines()
    start = next(i for i,
                 ln in enumerate(lines) if ln.startswith("| method | config | `Upload.params` | `Upload.extra`"))
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        config = dict(re.findall(r"`([\w.]+): (\w+)`", cells[1]))
        rows.append({"method": cells[0], "config": config, "extra": set(re.findall(r"`(\w+)`", cells[3]))})
    return rows


def upload_of(config_row: dict):
    method = {"name": "m", "algorithm": config_row["algorithm"]}
    model = {k.split(".", 1)[1]: {"true": True, "false": False}.get(v, v) for k, v in config_row.items()
             if k.startswith("model.")}
    if model:
        method["model"] = model
    from hetfed.algorithms import registry

    method["params"] = dict(registry.get(method["algorithm"]).quick)  # a federation of 3 (FedBuff's concurrency)
    if method["algorithm"] == "fsnet":
        method["params"] = {"server_steps": 1}
    cfg = build_config({"partition": {"clients": 3}, "train": {"rounds": 1, "local_steps": 2}, "methods": [method]})
    fed = prepare(cfg, progress=False).federation
    algo = algorithm_for(cfg, cfg.methods[0], fed.input_shape, fed.n_classes)
    algo.bind(fed, 0, 2)  # as the driver does, then the executor hands the stack its clients' broadcast
    server = algo.server_init(torch_gen(0, SERVER_INIT))
    states = stack_states([algo.client_init(k, torch_gen(0, CLIENT_INIT, k)) for k in (0, 1)])
    pool = Pool(torch.as_tensor(fed.x), torch.as_tensor(fed.y), fed.train, 0, fed.val)
    upload, _ = algo.local_update(algo.broadcast(server, 0).for_clients([0, 1]), states, client_data(pool, [0, 1], 0))
    return upload, algo


def test_the_table_in_the_docs_is_the_one_the_registry_writes(capsys):
    from hetfed.algorithms import registry
    from hetfed.cli import main

    text = DOC.read_text()
    block = text.split("<!-- privacy-table:", 1)[1].split("\n", 1)[1].split("<!-- /privacy-table -->")[0]
    assert block == registry.privacy_table()
    assert main(["algorithms", "--privacy-table"]) == 0
    assert capsys.readouterr().out == registry.privacy_table()


def test_the_table_covers_every_algorithm():
    from hetfed.algorithms import registry

    documented = {r["config"]["algorithm"] for r in table_rows()}
    shipped = {s.name for s in registry.specs() if s.cls.__module__.startswith("hetfed.")}  # not tests' toys
    assert documented == shipped


def _on_features(row: dict) -> bool:
    """A row whose model reads the default data's feature vectors (the LoRA methods' encoder reads a tokenizer's
    ids: their uploads are checked on a tiny encoder in tests/models/test_lora.py)."""
    from tests.feature_methods import model_reads_features

    kind = row["config"].get("model.kind")
    return kind is None or model_reads_features(kind)


@pytest.mark.parametrize("row", [r for r in table_rows() if _on_features(r)], ids=lambda r: r["method"])
def test_each_method_uploads_exactly_what_the_table_says(row):
    upload, algo = upload_of(row["config"])
    assert set(upload.extra) == row["extra"], row["method"]
    assert not set(upload.params) & set(algo.model.local_names)  # local parameters never leave
