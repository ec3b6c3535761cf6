"""hetfed on Flower's Simulation Engine: the same algorithm objects give the in-process numbers and send only what
is documented (the wire log); FedMoE's opted-out clients send no training reply; a node trains its cohort
vectorised."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("flwr", reason="the flower extra is part of the test extra")

from tests.flower_compare import SMALL, compare, config, summary_of  # noqa: E402

pytestmark = pytest.mark.slow


WIRE_METHODS = {"methods": [
    {"name": "fedavg", "algorithm": "fedavg"},
    {"name": "cgau", "algorithm": "fedavg", "model": {"kind": "cgau"},
     "train": {"optimizer": {"reset_each_round": False}}},  # kept optimiser state must stay on the node too
    {"name": "fsnet", "algorithm": "fsnet", "params": {"server_steps": 5}},
]}

def test_simulation_engine_gives_the_vectorised_numbers_and_sends_only_what_is_documented(tmp_path, monkeypatch):
    wire = tmp_path / "wire.jsonl"
    monkeypatch.setenv("HETFED_FLOWER_WIRE_LOG", str(wire))
    flower = summary_of(config({**WIRE_METHODS, "flower": {"clients_per_node": 2}}, "flower"), tmp_path / "f")
    vec = summary_of(config(WIRE_METHODS, "vectorised"), tmp_path / "v")
    compare(flower, vec)
    # Γ from the summaries the clients sent at set-up equals Γ measured in-process on the same federation
    for m in flower["methods"].values():
        assert m["gamma_from_summaries"]["gamma"] == pytest.approx(flower["gamma"], rel=1e-6)
        assert m["gamma_from_summaries"]["clients"] == 4 and m["gamma_from_summaries"]["measured_on"] == "train"

    from hetfed.models import build_model

    cfg = config(WIRE_METHODS, "vectorised")
    local_names = set(build_model(cfg.method_model(cfg.methods[1]), (8, 8), 10).local_names)
    assert local_names  # CGAU's conditioning rows
    entries = [json.loads(line) for line in wire.read_text().splitlines()]
    trains = [e for e in entries if e["type"] == "train"]
    assert trains and {e["type"] for e in entries} == {"query", "train", "evaluate"}
    for e in entries:
        keys = {k for rec in e["records"].values() for k in rec}
        assert not keys & local_names, e
        assert not any(k.startswith("opt.") for k in keys), e
    assert {frozenset(e["records"]["upload"]) for e in trains} == {frozenset({"num_samples", "clients"})}
    queries = [e for e in entries if e["type"] == "query"]  # set-up: who am I, and the Γ summary, once per method
    assert {frozenset(e["records"]) for e in queries} == {frozenset({"node", "summary"})}
    assert {frozenset(e["records"]["summary"]) for e in queries} == {frozenset({"n", "total", "outer"})}
    extra_keys = {frozenset(e["records"]["upload_extra.arrays"]) for e in trains}
    documented = {
        frozenset({"train_loss"}),  # FedAvg, CGAU
        frozenset({"train_loss", "input_mean", "input_var"}),  # Fed-FSNet: the documented input moments
    }
    assert extra_keys == documented
    extras = {"upload", "upload_extra.arrays", "upload_extra.values"}
    for e in trains:  # a node of 2 clients sends their summed update (mean) or, alone, its one client's (params)
        assert set(e["records"]) in ({"params", *extras}, {"mean", "screened", *extras})
        assert set(e["records"]["upload_extra.values"]) == {"__absent__", "__empty__"}
        shared = e["records"].get("params", e["records"].get("mean"))
        assert set(shared) <= {"layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias",
                               "layers.2.weight", "layers.2.bias"} | {n for n in _cgau_shared(cfg)}
    assert any("mean" in e["records"] for e in trains)


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA (run on the GPU machine)")
@pytest.mark.parametrize("per_node", [1, 2])  # each client's update, or a node's cohort reduced there
def test_on_cuda_the_simulation_engine_gives_the_vectorised_numbers(tmp_path, per_node):
    """``train.device: cuda`` on Flower: the ClientApps train on the GPU and the server screens, sums and scores
    the nodes' uploads there (they arrived on the CPU once, and the server's mean or its evaluation failed on mixed
    devices)."""
    methods = {"methods": [WIRE_METHODS["methods"][0], WIRE_METHODS["methods"][2]],
               "train": {**SMALL["train"], "device": "cuda"}}
    flower = summary_of(config({**methods, "flower": {"clients_per_node": per_node}}, "flower"), tmp_path / "f")
    compare(flower, summary_of(config(methods, "vectorised"), tmp_path / "v"))


def _cgau_shared(cfg) -> set[str]:
    from hetfed.models import build_model

    return set(build_model(cfg.method_model(cfg.methods[1]), (8, 8), 10).shared_names)


def test_fedmoe_on_flower_matches_and_opted_out_clients_send_no_training_reply(tmp_path, monkeypatch):
    wire = tmp_path / "wire.jsonl"
    monkeypatch.setenv("HETFED_FLOWER_WIRE_LOG", str(wire))
    moe = {
        "partition": {"kind": "majority", "clients": 6, "p": 0.8, "samples_per_client": 60, "opt_out": 0.34},
        "train": {"rounds": 3, "clients_per_round": 2, "local_epochs": 1, "batch_size": 16, "eval_every": 1},
        # the views scored by 4 of the 6 clients (all personalised): each node names which of its clients score
        "methods": [{"algorithm": "fedmoe", "params": {"max_epochs": 3, "patience": 2, "eval_clients": 4}}],
    }
    flower = summary_of(config({**moe, "flower": {"clients_per_node": 3}}, "flower"), tmp_path / "f")  # 2 nodes × 3
    vec = summary_of(config(moe, "vectorised"), tmp_path / "v")
    compare(flower, vec)
    from hetfed.pipeline import prepare

    fed = prepare(config(moe, "vectorised"), progress=False).federation
    opted_out = {int(k) for k in range(fed.n_clients) if fed.opted_out[k]}
    assert opted_out
    entries = [json.loads(line) for line in wire.read_text().splitlines()]
    trained = {k for e in entries if e["type"] == "train" for k in e["clients"]}
    personalised = {k for e in entries if e["type"] == "train.personalise" for k in e["clients"]}
    assert not trained & opted_out
    assert personalised == set(range(fed.n_clients))  # opted-out clients still get their own models
    # the views' evaluations ride on the personalisation: one exchange per node, no evaluation message after it
    last = max(i for i, e in enumerate(entries) if e["type"] == "train.personalise")
    assert [e["type"] for e in entries[last + 1:]] == []
    from hetfed.flower.names import VIEW_RECORDS

    names = ("local", "fedavg", "finetuned", "mixture")
    views = {VIEW_RECORDS.format(view=v, name=n) for v in names for n in ("metrics", "arrays", "missing")}
    for e in entries:
        if e["type"] == "train.personalise":  # only the epochs and seconds leave, and the views' scores: no
            # specialist, no gate
            assert set(e["records"]) == {"info"} | views
            assert all(k.split(".")[0] in ("epochs", "seconds") for k in e["records"]["info"])
            for v in names:  # a view's scores: each client's numbers, no tensor (no model, no prediction)
                scores = e["records"][VIEW_RECORDS.format(view=v, name="metrics")]
                assert scores and all(k.split("_")[0] in ("global", "local", "val") or k.startswith("mean.gate")
                                      for k in scores), scores
                assert e["records"][VIEW_RECORDS.format(view=v, name="arrays")] == []


COHORT_METHODS = {
    "partition": {"kind": "feature_clusters", "clients": 6, "opt_out": 0.2},
    "train": {"rounds": 2, "local_steps": 3, "batch_size": 16, "eval_every": 1, "eval_global_clients": 2},
    "methods": [
        {"name": "avg", "algorithm": "fedavg"},
        {"name": "scaffold", "algorithm": "scaffold"},
        {"name": "cgau", "algorithm": "fedavg", "model": {"kind": "cgau"},
         "train": {"optimizer": {"reset_each_round": False}}},
        {"name": "fedmoe", "algorithm": "fedmoe", "params": {"max_epochs": 2, "patience": 1}},
        {"name": "median", "algorithm": "fedavg", "server": {"combine": {"rule": "median"}}},  # held per client
        # the server's own update on its labelled root set (a holdout no node holds)
        {"name": "fltrust", "algorithm": "fedavg", "server": {"combine": {"rule": "fltrust"}}},
    ]}


def test_a_node_trains_its_cohort_vectorised_and_gives_the_in_process_numbers(tmp_path, monkeypatch):
    """2 nodes with 3 clients each: the numbers of the in-process executor (one client per node is the
    deployment test's); a cohort's reply carries its clients' summed update, or — when the round holds
    every update (the median) — each client's."""
    wire = tmp_path / "wire.jsonl"
    monkeypatch.setenv("HETFED_FLOWER_WIRE_LOG", str(wire))
    flower = summary_of(config({**COHORT_METHODS, "flower": {"clients_per_node": 3}}, "flower"), tmp_path / "f")
    compare(flower, summary_of(config(COHORT_METHODS, "vectorised"), tmp_path / "v"))
    entries = [json.loads(line) for line in wire.read_text().splitlines()]
    assert {len(e["clients"]) for e in entries if e["type"] == "query"} == {3}
    trains = [e for e in entries if e["type"] == "train" and len(e["clients"]) > 1]
    assert trains
    for e in trains:
        assert ("params" in e["records"]) != ("mean" in e["records"])
        if "mean" in e["records"]:
            assert set(e["records"]["screened"]) == {"rejected_nonfinite", "rejected_norm"}
    assert any("mean" in e["records"] for e in trains) and any("params" in e["records"] for e in trains)


def test_a_synchronous_round_on_the_wall_clock_lasts_its_exchanges_real_seconds(tmp_path):
    """``train.clock.latency: wall`` on Flower for FedAvg: each round's ``round_time`` is its training exchange's
    real seconds (not a model's), ``sim_time`` their sum, within the rounds' real time (``train_s``); in process it
    is refused, as there is no exchange to time."""
    import pandas as pd

    from hetfed.cli import main

    out = tmp_path / "w"
    args = ["run", "--quiet", "--set", "partition.clients=4", "--set", "train.rounds=3", "--set",
            "train.clock.latency=wall", "--set", "methods=[{algorithm: fedavg}]", "--set", "heterogeneity.gamma=false"]
    assert main([*args, "--out", str(out), "--set", "train.executor=flower"]) == 0
    m = pd.read_csv(out / "metrics.csv")
    train = m[m.split == "train"].pivot_table(index="round", columns="metric", values="value")
    assert list(train.index) == [1, 2, 3] and (train.round_time > 0).all()
    assert train.sim_time.tolist() == pytest.approx(train.round_time.cumsum().tolist(), rel=1e-9)
    method = json.loads((out / "summary.json").read_text())["methods"]["fedavg"]
    assert train.sim_time.iloc[-1] <= method["seconds_per_round"] * method["rounds"]  # the rounds' real time
    assert main([*args, "--out", str(tmp_path / "here")]) == 2 and not (tmp_path / "here").exists()
