"""``hetfed partition --export DIR``: the simulated clients written as a real federation's SuperNodes' own files and
the config that runs the methods on them — each client's rows as the simulation holds them, node P the P-th block of
clients; what cannot be exported refused before any data is loaded; and (slow) a loopback deployment of those nodes
measures the simulation's Γ from the clients' summaries."""

from __future__ import annotations

import json
import zipfile

import numpy as np
import pytest

from hetfed.cli import main
from hetfed.config import build_config, load_config
from hetfed.errors import ConfigError, DataError
from hetfed.flower.discovery import skeleton
from hetfed.flower.node_data import node_federation
from hetfed.pipeline import build_federation


def _rows(x: np.ndarray, y: np.ndarray) -> list[tuple[bytes, int]]:
    """A client's rows as a sorted multiset (order-free: a node numbers and splits its clients itself)."""
    return sorted(zip(map(bytes, np.ascontiguousarray(x, dtype=np.float32)), np.asarray(y).tolist(), strict=True))


def test_each_node_serves_its_block_of_clients_with_their_rows_and_the_config_runs_them(tmp_path, capsys):
    sets = ["--set", "partition.kind=dirichlet", "--set", "partition.alpha=0.3", "--set", "seed=3"]
    assert main(["partition", *sets, "--export", str(tmp_path / "ex"), "--nodes", "3"]) == 0
    err = capsys.readouterr().err
    assert "3 SuperNodes' files, federation.yaml and nodes.txt written" in err
    assert f"hetfed flower start DEP --node-configs {tmp_path / 'ex' / 'nodes.txt'}, then hetfed flower run " in err
    simulated = build_federation(load_config(None, [s for s in sets if s != "--set"]), progress=False).federation
    config = load_config(str(tmp_path / "ex" / "federation.yaml"), executor="deployment")
    assert (config.dataset.name, config.partition.kind, config.flower.nodes) == ("nodes", "natural", 3)
    assert config.methods == load_config(None).methods  # the methods as the simulation's config has them
    options = (tmp_path / "ex" / "nodes.txt").read_text().splitlines()
    server = skeleton(config, [(0, 0, simulated.n_clients)])  # the server's view: its own test set, no client rows
    assert config.dataset.params.global_test == str((tmp_path / "ex" / "global-test.npz").resolve())
    assert server.x_global_test.tobytes() == np.asarray(simulated.x_global_test, np.float32).tobytes()
    assert server.y_global_test.tolist() == np.asarray(simulated.y_global_test).tolist() and len(server.x) == 0
    blocks = np.array_split(np.arange(simulated.n_clients), 3)
    for p, block in enumerate(blocks):
        path = tmp_path / "ex" / f"node-{p}.npz"
        with zipfile.ZipFile(path) as npz:  # compressed: the files travel to the sites
            assert {info.compress_type for info in npz.infolist()} == {zipfile.ZIP_DEFLATED}
        test = (tmp_path / "ex" / "global-test.npz").resolve()
        assert options[p] == (f"--node-config 'data=\"{path.resolve()}\" label=\"y\" client=\"client\" "
                              f"split=\"split\" position={p} global-test=\"{test}\"'")
        node = node_federation({"data": str(path), "label": "y", "client": "client", "split": "split",
                                "global-test": str(test)}, config)
        drawn = node_federation({"data": str(path), "label": "y", "client": "client"}, config)
        # the clients' personalised models score the simulation's global test set, as the server's model does
        assert node.x_global_test.tobytes() == server.x_global_test.tobytes()
        assert node.y_global_test.tolist() == server.y_global_test.tolist() and len(drawn.y_global_test) == 0
        assert node.n_clients == drawn.n_clients == len(block)
        x = np.asarray(simulated.x).reshape(len(simulated.x), -1)
        for mine, k in enumerate(block):  # a node numbers its clients in their order in the file
            theirs = simulated.client_indices(int(k))
            assert _rows(drawn.x[drawn.client_indices(mine)], drawn.y[drawn.client_indices(mine)]) == _rows(
                x[theirs], np.asarray(simulated.y)[theirs])  # without the split column: its rows, split anew
            for split in ("train", "val", "test"):  # with it: the simulation's splits, row for row, in their order
                rows, sim = getattr(node, split)[mine], getattr(simulated, split)[int(k)]
                assert node.x[rows].tobytes() == x[sim].astype(np.float32).tobytes()
                assert node.y[rows].tolist() == np.asarray(simulated.y)[sim].tolist()
    missing = str(tmp_path / "ex" / "gone.npz")
    with pytest.raises(DataError, match=f"node config global-test '{missing}' does not exist"):
        node_federation({"data": str(tmp_path / "ex" / "node-0.npz"), "global-test": missing}, config)


@pytest.mark.parametrize("args,expected", [
    (["--nodes", "2"], "--nodes 2 is not allowed without --export DIR"),
    (["--export", "OUT", "--nodes", "0"], "--nodes 0 is not allowed: expected ≥ 1"),
    (["--export", "OUT", "--set", "partition.opt_out=0.2"], "partition.opt_out = 0.2 is not allowed with --export"),
    (["--export", "FULL"], "--export '{FULL}' already exists and is not empty"),  # the option the user typed
    (["--export", "FILE/nodes"], "--export '{FILE/nodes}' cannot be created for the nodes' files: Not a directory"),
    (["--export", "FILE"], "--export '{FILE}' is a file: expected a new or empty directory for the nodes' files"),
])
def test_what_cannot_be_exported_is_one_line_before_any_data_is_loaded(tmp_path, capsys, monkeypatch, args, expected):
    import hetfed.cli

    (tmp_path / "FULL").mkdir()
    (tmp_path / "FULL" / "x").write_text("x")
    (tmp_path / "FILE").write_text("x")
    monkeypatch.setattr(hetfed.cli, "partition_report", lambda *a, **k: pytest.fail("loaded the data"))
    folders = ("OUT", "FULL", "FILE", "FILE/nodes")
    assert main(["partition", *[str(tmp_path / a) if a in folders else a for a in args]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected.format(**{a: tmp_path / a for a in folders}) in err[0], err
    assert not (tmp_path / "OUT").exists()


@pytest.mark.slow
def test_a_deployment_of_the_exported_nodes_gives_the_simulations_numbers(tmp_path, capfd):
    """The exported nodes on a loopback deployment — a CNN, each node reading its rows as images (``dataset.shape``)
    — train and evaluate the clients the simulation did, in its splits (the ``split`` column) and under its client
    numbers (each node's ``position``), and the server scores its model on the simulation's global test set
    (``dataset.global_test``), so every client's metrics, their means and the server's global scores are the
    simulated run's (to float rounding: the nodes sum their cohorts before the server does); and Γ on each client's
    train rows (the default ``heterogeneity.on``; the simulation's rows, by the split column), computed by the server
    from the clients' summaries, is the simulation's."""
    pytest.importorskip("flwr", reason="the flower extra is part of the test extra")
    import pandas as pd

    from hetfed.flower.deploy import LocalDeployment
    from hetfed.processes import process_alive

    sets = ["--set", "partition.clients=4", "--set", "train.rounds=2", "--set",
            "model.kind=cnn", "--set", "methods=[{algorithm: fedavg}, {algorithm: ditto}]", "--set",
            "train.local_steps=2", "--set", "flower.connect_timeout=300"]
    assert main(["partition", *sets, "--json", "--export", str(tmp_path / "ex"), "--nodes", "2"]) == 0
    simulated = json.loads(capfd.readouterr().out)
    assert main(["run", *sets, "--out", str(tmp_path / "sim"), "--no-report"]) == 0
    out, dep = tmp_path / "run", str(tmp_path / "dep")
    assert main(["flower", "start", dep, "--node-configs", str(tmp_path / "ex" / "nodes.txt")]) == 0
    pids = LocalDeployment.load(dep).pids
    assert len(pids) == 1 + 2  # the SuperLink and a SuperNode a line of nodes.txt
    try:  # as a user runs it: the nodes of nodes.txt started, the exported config submitted to them
        code = main(["flower", "run", str(tmp_path / "ex" / "federation.yaml"), "--deployment", dep, "--out", str(out),
                     "--no-report"])
    finally:
        assert main(["flower", "stop", dep]) == 0
    printed = capfd.readouterr()
    assert code == 0, printed.out[-3000:] + printed.err[-3000:]
    assert not any(map(process_alive, pids.values()))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_clients"] == 4
    assert summary["gamma"] == pytest.approx(simulated["gamma"], rel=1e-6)
    key = ["method", "round", "split", "client", "metric"]
    real, sim = (pd.read_csv(d / "metrics.csv").set_index(key)["value"] for d in (out, tmp_path / "sim"))
    scored = real[real.index.get_level_values("metric").str.contains("local_|val_|global_")]
    assert len(scored) >= 2 * 2 * ((4 + 1) * 4 + 2)  # each method, round: every client's and the mean's local and
    assert {"global_accuracy", "global_loss"} <= set(scored.index.get_level_values("metric"))  # val scores, global
    ditto = scored.xs("ditto", level="method")  # Ditto's clients score their own models on the global test set too
    assert ditto.xs("client", level="split").index.get_level_values("metric").str.startswith("global_").any()
    assert scored.to_numpy() == pytest.approx(sim.loc[scored.index].to_numpy(), rel=1e-5, abs=1e-7)
    # what differs: the rounds are timed by the wall clock (the server does not know the nodes' clients' sizes), a
    # round's training exchange's real seconds — more than the simulated clock's model of them
    clock = real.xs("train", level="split").xs("all", level="client").unstack("metric")
    assert (clock.round_time > sim.xs("train", level="split").xs("all", level="client").unstack("metric").round_time
            ).all()
    assert clock.sim_time.tolist() == pytest.approx(clock.round_time.groupby(level="method").cumsum().tolist(),
                                                    rel=1e-9)


def test_an_export_whose_methods_the_nodes_could_not_run_is_one_line_and_writes_nothing(tmp_path, capsys):
    """The nodes hold no server data: a method that distils on it (FedDF) is refused when the export is asked for, not
    when the deployment's ServerApp builds it."""
    assert main(["partition", "--set", "methods=[{algorithm: feddf}]", "--export", str(tmp_path / "ex")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: --export: the nodes could not run this config's methods: server_data")
    assert not (tmp_path / "ex").exists()


def test_an_image_model_reads_the_nodes_rows_as_the_images_the_simulation_trained_on(tmp_path):
    """The nodes' files hold flattened rows, as a simulated federation holds its images; ``dataset.shape`` tells the
    models their shape, so a CNN study exports: each node's rows are the simulation's images, read in the same shape
    on the nodes and in the server's view of them."""
    assert main(["partition", "--set", "model.kind=cnn", "--export", str(tmp_path / "ex"), "--nodes", "2"]) == 0
    simulated = build_federation(load_config(None, ["model.kind=cnn"]), progress=False).federation
    config = load_config(str(tmp_path / "ex" / "federation.yaml"), executor="deployment")
    assert config.dataset.params.shape == list(simulated.input_shape) == [8, 8]
    node = node_federation({"data": str(tmp_path / "ex" / "node-0.npz"), "label": "y", "client": "client"}, config)
    assert node.input_shape == simulated.input_shape and node.x.shape[1:] == simulated.x.shape[1:] == (64,)
    rows, theirs = node.client_indices(0), simulated.client_indices(0)
    assert sorted(map(bytes, node.x[rows])) == sorted(map(bytes, np.asarray(simulated.x, np.float32)[theirs]))
    assert skeleton(config, [(0, 0, 3)]).input_shape == (8, 8)


@pytest.mark.parametrize("shape", [[8, 9], [], [64, 0]])
def test_a_shape_that_is_not_the_features_is_one_line(shape):
    with pytest.raises(ConfigError, match=r"dataset.shape = \[.*\] is not allowed with dataset.features = 64"):
        build_config({"dataset": {"name": "nodes", "features": 64, "classes": [0, 1], "shape": shape},
                      "partition": {"kind": "natural", "clients": None}})


def test_the_servers_test_set_is_checked_as_a_nodes_file_is(tmp_path):
    """``dataset.global_test``: a file on the server's machine, read when the server sets the federation up; one that
    does not fit the schema is refused naming the key and the file."""
    from hetfed.errors import DataError

    np.savez(tmp_path / "short.npz", x=np.zeros((5, 3), np.float32), y=np.zeros(5, np.int64))
    np.savez(tmp_path / "labels.npz", x=np.zeros((5, 4), np.float32), y=np.full(5, 7))
    for name, message in (("short.npz", "has 3 feature columns: expected dataset.features = 4"),
                          ("labels.npz", "labels \\['7'\\] are not in dataset.classes"),
                          ("missing.npz", "does not exist")):
        config = build_config({"dataset": {"name": "nodes", "features": 4, "classes": [0, 1],
                                           "global_test": str(tmp_path / name)},
                               "partition": {"kind": "natural", "clients": None}})
        with pytest.raises(DataError, match=message):
            skeleton(config, [(0, 0, 2)])


def test_the_nodes_files_name_the_classes_as_the_dataset_does(tmp_path):
    """Where the dataset names its classes (Fashion-MNIST's "T-shirt/top" …), the nodes' files and the server's test
    set hold the names and ``dataset.classes`` lists them by class id, so each node reads the simulation's class ids
    back; names that repeat (or none) leave the ids."""
    from hetfed.partition_export import export_nodes

    config = load_config(None, [])
    fed = build_federation(config, progress=False).federation
    names = [f"digit {c}" for c in range(fed.n_classes)]
    export_nodes(config, fed, tmp_path / "named", 2, names)
    deployment = load_config(str(tmp_path / "named" / "federation.yaml"), executor="deployment")
    assert deployment.dataset.params.classes == names
    assert np.load(tmp_path / "named" / "node-0.npz")["y"][0].startswith("digit ")
    node = node_federation({"data": str(tmp_path / "named" / "node-0.npz"), "label": "y", "client": "client",
                            "split": "split"}, deployment)
    assert node.y[node.train[0]].tolist() == np.asarray(fed.y)[fed.train[0]].tolist()
    assert skeleton(deployment, [(0, 0, 1)]).y_global_test.tolist() == np.asarray(fed.y_global_test).tolist()
    export_nodes(config, fed, tmp_path / "repeated", 2, ["a"] * fed.n_classes)
    repeated = load_config(str(tmp_path / "repeated" / "federation.yaml"), executor="deployment")
    assert repeated.dataset.params.classes == list(range(fed.n_classes))


def test_the_python_api_exports_what_the_command_does(tmp_path):
    import hetfed

    sets = ["partition.kind=dirichlet", "partition.alpha=0.3", "seed=3"]
    assert main(["partition", *[a for s in sets for a in ("--set", s)], "--export", str(tmp_path / "cli")]) == 0
    written = hetfed.build_federation(hetfed.load_config(None, sets)).export(tmp_path / "api")
    assert [p.name for p in written] == sorted(p.name for p in (tmp_path / "cli").glob("node-*.npz"))
    for path in written:
        mine, theirs = np.load(path), np.load(tmp_path / "cli" / path.name)
        assert all(np.array_equal(mine[k], theirs[k]) for k in ("x", "y", "client", "split"))
    assert (tmp_path / "api" / "nodes.txt").read_text() == (tmp_path / "cli" / "nodes.txt").read_text().replace(
        str((tmp_path / "cli").resolve()), str((tmp_path / "api").resolve()))
