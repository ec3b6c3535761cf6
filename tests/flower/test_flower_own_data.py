"""A real federation: every SuperNode serves a file of its own (CSV, NPZ, Parquet), the server never sees a
dataset. CGAU and FedMoE train on it over a secure loopback deployment, a node whose file does not fit the run is
named with its problem and left out, and Γ from the nodes' summaries equals Γ of `hetfed partition` on the same
rows gathered in one file."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr", reason="the flower extra is part of the test extra")
pytest.importorskip("pyarrow", reason="the parquet extra is part of the test extra")

CLASSES = ["benign", "malignant"]
D = 4


def _site(seed: int, n: int, shift: float) -> tuple[np.ndarray, np.ndarray]:
    """One site's rows: a shifted, scaled Gaussian (sites differ: Γ > 0) and a linear label."""
    rng = np.random.default_rng(seed)
    x = (rng.normal(size=(n, D)) * (1 + shift / 2) + shift).astype(np.float32)
    y = np.where(x[:, 0] + x[:, 1] > 2 * shift, "malignant", "benign")
    return x, y


def _write_csv(path: Path, x: np.ndarray, y: np.ndarray, label: str) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([f"f{j}" for j in range(x.shape[1])] + [label])
        for row, lab in zip(x, y, strict=True):
            w.writerow([repr(float(v)) for v in row] + [lab])


def _write_parquet(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({**{f"f{j}": x[:, j] for j in range(x.shape[1])}, "y": y.tolist()}), path)


def _sites(tmp_path: Path) -> tuple[list[str], list[tuple[np.ndarray, np.ndarray]]]:
    sites = [_site(1, 90, 0.0), _site(2, 70, 1.0), _site(3, 80, 2.5)]
    (x0, y0), (x1, y1), (x2, y2) = sites
    _write_csv(tmp_path / "a.csv", x0, y0, "diagnosis")
    np.savez(tmp_path / "b.npz", x=x1, y=y1)
    _write_parquet(tmp_path / "c.parquet", x2, y2)
    bad = tmp_path / "bad.csv"  # one feature column short
    _write_csv(bad, x0[:, :3], y0, "diagnosis")
    configs = [f'data="{tmp_path / "a.csv"}" label="diagnosis"', f'data="{tmp_path / "b.npz"}"',
               f'data="{tmp_path / "c.parquet"}"', f'data="{bad}" label="diagnosis"']
    return configs, sites


def _config(tmp_path: Path) -> Path:
    import yaml

    raw = {
        "dataset": {"name": "nodes", "features": D, "classes": CLASSES},
        "partition": {"kind": "natural", "clients": None},
        "heterogeneity": {"on": "all"},
        "model": {"hidden": [8]},
        "train": {"executor": "flower", "rounds": 1, "local_steps": 3, "batch_size": 16, "eval_every": 1},
        "flower": {"nodes": 4, "connect_timeout": 300},
        "methods": [{"name": "cgau", "algorithm": "fedavg", "model": {"kind": "cgau"}},
                    {"algorithm": "fedmoe", "params": {"max_epochs": 2, "patience": 1}}],
    }
    path = tmp_path / "nodes.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.slow
def test_nodes_with_their_own_files_train_cgau_and_fedmoe_and_gamma_comes_from_their_summaries(tmp_path, capfd):
    from hetfed.cli import main
    from hetfed.flower.deploy import LocalDeployment

    node_configs, sites = _sites(tmp_path)
    config = _config(tmp_path)
    out = tmp_path / "run"
    with LocalDeployment(tmp_path / "dep", 4, node_configs=node_configs):
        code = main(["flower", "run", str(config), "--deployment", str(tmp_path / "dep"), "--out", str(out)])
    printed = capfd.readouterr()
    assert code == 0, printed.out[-3000:] + printed.err[-3000:]
    # the node whose file does not fit is named with its problem, and the run went on without it
    assert "bad.csv' has 3 feature columns: expected dataset.features = 4" in printed.out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_clients"] == 3
    assert set(summary["methods"]) == {"cgau", "fedavg", "local", "finetuned", "mixture"}  # FedMoE's views
    for row in summary["methods"].values():
        assert 0.0 <= row["final"]["local_accuracy_mean"] <= 1.0
        assert row["final"]["global_accuracy"] is None  # no global test set: the server holds no data
    # the report says why it draws no client sizes or classes instead of drawing empty figures
    assert "the nodes hold their own data" in (out / "report.html").read_text()
    # Γ from the summaries the nodes sent = Γ of the same rows partitioned in process (one file, a client column)
    x = np.concatenate([s[0] for s in sites])
    y = np.concatenate([s[1] for s in sites])
    site = np.repeat([0, 1, 2], [len(s[1]) for s in sites])
    extra_x, extra_y = _site(9, 40, 1.0)  # a global test split, as `hetfed partition` needs one; no client's rows
    labels = np.array([CLASSES.index(v) for v in np.concatenate([y, extra_y])])  # the arrays loader reads class ids
    np.savez(tmp_path / "all.npz", x=np.concatenate([x, extra_x]), y=labels,
             client=np.concatenate([site, np.full(len(extra_y), -1)]),
             split=np.array(["train"] * len(y) + ["test"] * len(extra_y)))
    from hetfed.config import build_config
    from hetfed.pipeline import prepare

    reference = prepare(build_config({
        "dataset": {"name": "arrays", "path": str(tmp_path / "all.npz")},
        "partition": {"kind": "natural", "clients": None}, "heterogeneity": {"on": "all"}}), progress=False)
    assert reference.federation.n_clients == 3
    assert summary["gamma"] == pytest.approx(reference.heterogeneity.gamma, rel=1e-6)
    for row in summary["methods"].values():
        if "gamma_from_summaries" in row:
            assert row["gamma_from_summaries"]["gamma"] == pytest.approx(reference.heterogeneity.gamma, rel=1e-6)


def test_a_node_file_that_does_not_fit_the_run_is_refused_with_the_file_and_the_problem(tmp_path):
    from hetfed.config import build_config
    from hetfed.errors import DataError
    from hetfed.flower.node_data import node_federation

    cfg = build_config({"dataset": {"name": "nodes", "features": D, "classes": CLASSES},
                        "partition": {"kind": "natural", "clients": None}, "flower": {"nodes": 1},
                        "train": {"executor": "flower"}})
    x, y = _site(1, 30, 0.0)
    _write_csv(tmp_path / "ok.csv", x, y, "diagnosis")
    fed = node_federation({"data": str(tmp_path / "ok.csv"), "label": "diagnosis"}, cfg)
    assert fed.n_clients == 1 and len(fed.x_global_test) == 0
    rows = np.sort(np.concatenate([fed.train[0], fed.val[0], fed.test[0]]))
    assert np.array_equal(rows, np.arange(30)) and np.array_equal(fed.x, x)
    assert np.array_equal(fed.y, (y == "malignant").astype(np.int64))  # class id = position in dataset.classes
    cases = {
        "missing.csv": ("does not exist", None),
        "short.csv": ("has 3 feature columns: expected dataset.features = 4", (x[:, :3], y)),
        "unknown.csv": ("labels ['cyst'] are not in dataset.classes", (x, np.where(y == "benign", "cyst", y))),
        "empty.csv": ("is empty", "")}
    for name, (message, content) in cases.items():
        path = tmp_path / name
        if isinstance(content, str):
            path.write_text(content)
        elif content is not None:
            _write_csv(path, *content, "diagnosis")
        with pytest.raises(DataError, match=message.replace("[", r"\[").replace("]", r"\]")) as err:
            node_federation({"data": str(path), "label": "diagnosis"}, cfg)
        assert name in str(err.value)
    # a client column makes several clients of one node
    np.savez(tmp_path / "silo.npz", x=x, y=y, client=np.repeat(["u1", "u2", "u3"], 10))
    assert node_federation({"data": str(tmp_path / "silo.npz"), "client": "client"}, cfg).n_clients == 3
    # the node config's label and client columns name them in NPZ and Parquet files too, not only in CSV
    import pyarrow as pa
    import pyarrow.parquet as pq

    users = np.repeat(["u1", "u2"], 15)
    np.savez(tmp_path / "named.npz", x=x, diagnosis=y, user=users)
    pq.write_table(pa.table({**{f"f{j}": x[:, j] for j in range(D)}, "diagnosis": y.tolist(), "user": users.tolist()}),
                   tmp_path / "named.parquet")
    for name in ("named.npz", "named.parquet"):
        fed = node_federation({"data": str(tmp_path / name), "label": "diagnosis", "client": "user"}, cfg)
        assert fed.n_clients == 2 and fed.x.shape == (30, D)  # neither column was taken for a feature
        assert np.array_equal(fed.x, x) and np.array_equal(fed.y, (y == "malignant").astype(np.int64))
        with pytest.raises(DataError, match="lacks the (array|column) 'outcome'"):
            node_federation({"data": str(tmp_path / name), "label": "outcome"}, cfg)


def test_a_node_config_key_hetfed_does_not_read_is_refused_in_the_nodes_answer():
    """A misspelt ``positon=0`` was ignored (the node's clients then numbered by its id, which changes at every
    start); a key of a node's own file on a node without one likewise. The node answers the server's set-up
    question with the refusal, which the server's user reads."""
    from hetfed.errors import DataError
    from hetfed.flower.client_app import set_up
    from hetfed.flower.node_data import check_node_config

    check_node_config({"partition-id": 0, "num-partitions": 2})  # a simulated node's
    check_node_config({"data": "f.csv", "label": "y", "client": "c", "split": "s", "position": 0, "global-test": "t"})
    with pytest.raises(DataError, match=r"node config positon = 0 is not allowed: did you mean 'position'\? "
                                        r"expected one of data, label, client, split, position, global-test, "
                                        r"partition-id, num-partitions"):
        check_node_config({"data": "f.csv", "positon": 0})
    with pytest.raises(DataError, match=r"node config global-test = 't.npz' is not allowed without data=\"FILE\""):
        check_node_config({"partition-id": 0, "global-test": "t.npz"})
    records, clients = set_up(None, {"data": "f.csv", "positon": 1})  # type: ignore[arg-type]
    assert clients == [] and records["node"]["error"].startswith("node config positon = 1 is not allowed")


def test_a_split_column_keeps_the_sites_own_train_validation_and_test_rows(tmp_path):
    """``split="…"`` in the node config: each client's rows as the column splits them (a site's own held-out test
    set), in the file's order, whatever partition.val_fraction / test_fraction say; in CSV, NPZ and Parquet alike.
    A value other than train / val / test, a client with no train row and a missing column are one-line errors."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hetfed.config import build_config
    from hetfed.errors import DataError
    from hetfed.flower.node_data import node_federation

    cfg = build_config({"dataset": {"name": "nodes", "features": D, "classes": CLASSES},
                        "partition": {"kind": "natural", "clients": None}, "flower": {"nodes": 1},
                        "train": {"executor": "flower"}})
    x, y = _site(2, 30, 0.0)
    users = np.repeat(["u1", "u2"], 15)
    part = np.array((["train"] * 9 + ["val"] * 2 + ["test"] * 4) * 2)
    with open(tmp_path / "site.csv", "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([f"f{j}" for j in range(D)] + ["diagnosis", "user", "part"])
        w.writerows([*map(repr, map(float, row)), lab, u, s] for row, lab, u, s in zip(x, y, users, part, strict=True))
    np.savez(tmp_path / "site.npz", x=x, diagnosis=y, user=users, part=part)
    pq.write_table(pa.table({**{f"f{j}": x[:, j] for j in range(D)}, "diagnosis": y.tolist(), "user": users.tolist(),
                             "part": part.tolist()}), tmp_path / "site.parquet")
    for name in ("site.csv", "site.npz", "site.parquet"):
        fed = node_federation({"data": str(tmp_path / name), "label": "diagnosis", "client": "user", "split": "part"},
                              cfg)
        assert fed.x.shape == (30, D) and np.array_equal(fed.x, x)  # the split column is not a feature
        for k, first in enumerate((0, 15)):
            assert fed.train[k].tolist() == list(range(first, first + 9))
            assert fed.val[k].tolist() == [first + 9, first + 10]
            assert fed.test[k].tolist() == list(range(first + 11, first + 15))
    bad = {"odd.npz": (np.where(part == "val", "holdout", part), "holds \\['holdout'\\]: expected only \\['train', "
                                                                   "'val', 'test'\\]"),
           "untrained.npz": (np.where(users == "u2", "test", part), "client 'u2' has no train row")}
    for name, (column, message) in bad.items():
        np.savez(tmp_path / name, x=x, diagnosis=y, user=users, part=column)
        with pytest.raises(DataError, match=message):
            node_federation({"data": str(tmp_path / name), "label": "diagnosis", "client": "user", "split": "part"},
                            cfg)
    # one process serving two nodes of one file (a Simulation Engine's worker) reads it as each node's config says
    from flwr.app import ConfigRecord

    from hetfed.config import dump_config
    from hetfed.flower.node import node_side

    run = ConfigRecord({"config": dump_config(cfg), "method": 0})
    given = {"data": str(tmp_path / "site.npz"), "label": "diagnosis", "client": "user"}
    kept = node_side(run, {**given, "split": "part"}).fed
    assert kept.val[0].tolist() == [9, 10] and node_side(run, given).fed.val[0].tolist() != [9, 10]
    with pytest.raises(DataError, match="has no (split column|column 'part')"):
        for name in ("site.npz", "site.csv"):
            node_federation({"data": str(tmp_path / name), "label": "diagnosis", "split": "phase"}, cfg)


def test_a_nodes_config_states_its_schema_and_runs_only_on_a_deployment(tmp_path, capsys):
    from hetfed.cli import main

    base = ["--set", "dataset.name=nodes", "--set", "partition.kind=natural", "--set", "partition.clients=null"]
    assert main(["run", *base, "--out", str(tmp_path / "r")]) == 2
    assert "needs dataset.features" in capsys.readouterr().err
    full = [*base, "--set", "dataset.features=4", "--set", "dataset.classes=[a, b]", "--set", "flower.nodes=2"]
    assert main(["run", *full, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "dataset.name = 'nodes' cannot be loaded here" in err and "hetfed flower run" in err
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("setting", ["train.clock.latency=lognormal", "train.clock.sample_seconds=0.01",
                                     "train.stragglers.distribution=lognormal", "train.clock.deadline=2"])
def test_nodes_with_their_own_data_are_timed_by_the_wall_clock_and_a_modelled_one_is_refused(setting):
    """The server of nodes with their own data does not know their clients' sizes: its rounds are timed by the wall
    clock (a modelled one gave every round one sample's time: 0.001 s), and a modelled clock or simulated stragglers
    set for them are refused before anything is submitted, the key named."""
    import warnings

    from hetfed.config import OverriddenKey, load_config
    from hetfed.engine.faults import Faults
    from hetfed.errors import ConfigError
    from hetfed.flower.discovery import skeleton
    from hetfed.runs.plan import check_config, plan
    from tests.flower_compare import REPO

    DEFAULT = REPO / "configs" / "default.yaml"

    base = ["dataset.name=nodes", "partition.kind=natural", "partition.clients=null", "dataset.features=64",
            "dataset.classes=[a, b, c, d, e, f, g, h, i, j]", "flower.nodes=2", "train.executor=flower",
            "methods=[{algorithm: fedavg}]"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", OverriddenKey)
        config = load_config(str(DEFAULT), base)
        wall = load_config(str(DEFAULT), [*base, "train.clock.latency=wall"])
        modelled = load_config(str(DEFAULT), [*base, setting])
    fed = skeleton(config, [(7, 0, 2), (8, 2, 3)])
    for accepted in (config, wall):
        check_config(accepted)
        run = plan(accepted, fed, None)[0]
        assert Faults(run.train, fed, 0, run.run.schedule).clock.wall
    key = setting.split("=")[0]
    with pytest.raises(ConfigError, match=f"^{key} = .* is not allowed with a federation of nodes with their own data"):
        check_config(modelled)


def test_the_nodes_clients_are_numbered_by_the_nodes_positions_not_their_ids(monkeypatch):
    """Flower draws a SuperNode's id anew at every start: the server numbers the clients of nodes that give a
    ``position`` in that order (then the others, by id), so a deployment started again numbers every client — and
    its clients draw their streams — as before; a position that is not a whole number ≥ 0 is the node's error."""
    from types import SimpleNamespace

    from hetfed.errors import DataError
    from hetfed.flower import discovery
    from hetfed.flower.node_data import position

    monkeypatch.setattr(discovery, "records_to_summaries", lambda content: [])

    def reply(clients: int, place: int | None = None) -> SimpleNamespace:
        rec = {"clients": list(range(clients)), "own": True, **({"position": place} if place is not None else {})}
        return SimpleNamespace(has_error=lambda: False, content=SimpleNamespace(config_records={"node": rec}))

    replies = {7: reply(2, 1), 3: reply(3), 9: reply(1, 0), 5: reply(4, 2), 1: reply(2)}
    usable, problems = discovery._usable(sorted(replies), replies)
    assert [(node, held, place) for node, held, _, place in usable] == [
        (9, 1, 0), (7, 2, 1), (5, 4, 2), (1, 2, None), (3, 3, None)] and not problems
    assert discovery._shared_positions([(node, place) for node, _, _, place in usable]) == []
    replies[4] = reply(1, 1)  # a second node at position 1: said, not refused
    usable, _ = discovery._usable(sorted(replies), replies)
    assert discovery._shared_positions([(node, place) for node, _, _, place in usable]) == [
        "warning: SuperNodes 4, 7 all have position=1: their clients are numbered in the order of the nodes' ids, "
        "which changes at every start; expected a position of its own a node"]
    assert [position(c) for c in ({}, {"position": 0}, {"position": "3"})] == [None, 0, 3]
    for bad in (-1, 1.5, "first", True):
        with pytest.raises(DataError, match=r"node config position = .* is not allowed: expected a whole number ≥ 0"):
            position({"position": bad})


def test_flower_start_reads_one_node_config_a_line_and_refuses_what_it_cannot(tmp_path, capsys):
    """``hetfed flower start DIR --node-configs FILE``: a SuperNode a line (nodes.txt's ``--node-config '…'`` or the
    config alone; blank lines and comments skipped); an unreadable file, an unquoted config, an unclosed quote,
    a --nodes that disagrees or neither option is one line, exit 2, nothing started."""
    from hetfed.cli import main
    from hetfed.flower.deploy import read_node_configs

    listed = tmp_path / "nodes.txt"
    listed.write_text("# the site's nodes\n--node-config 'data=\"/srv/a.npz\" label=\"y\" position=0'\n\n"
                      "data=\"/srv/b.csv\" label=\"diagnosis\"\n")
    assert read_node_configs(listed) == ['data="/srv/a.npz" label="y" position=0',
                                         'data="/srv/b.csv" label="diagnosis"']
    (tmp_path / "two.txt").write_text("--node-config data=1 label=2\n")
    (tmp_path / "open.txt").write_text("--node-config 'data=1\n")
    (tmp_path / "empty.txt").write_text("# none\n")
    for args, message in ((["--node-configs", str(tmp_path / "missing.txt")], "cannot be read"),
                          (["--node-configs", str(tmp_path / "two.txt")], "label=2': expected one node config"),
                          (["--node-configs", str(tmp_path / "open.txt")], "line 1: No closing quotation"),
                          (["--node-configs", str(tmp_path / "empty.txt")], "holds no node config"),
                          (["--node-configs", str(listed), "--nodes", "3"], "holds 2 node configs; expected --nodes 2"),
                          ([], "needs --nodes K (simulated partitions) or --node-configs FILE")):
        assert main(["flower", "start", str(tmp_path / "dep"), *args]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and message in err[0], err
        assert not (tmp_path / "dep").exists()
