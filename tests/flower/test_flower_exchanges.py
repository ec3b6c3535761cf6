"""How few exchanges a Flower round takes: one per node, its evaluation riding on the next training, the set-up
question on the first step; a text model travels like any other."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("flwr", reason="the flower extra is part of the test extra")

from tests.flower_compare import SMALL, compare, config, summary_of  # noqa: E402

pytestmark = pytest.mark.slow


def test_a_round_is_one_exchange_per_node_its_evaluation_riding_on_the_next_training(tmp_path, monkeypatch):
    """Round r's evaluation rides on round r + 1's training message, and the set-up query on round 1's: 2 nodes ×
    (round 1's training, one exchange per evaluated round) instead of 2 × (1 + 2 per round); the numbers stay the
    in-process ones
    (Ditto: its clients keep their personal models on the nodes). With early stopping a round goes out with an
    evaluation only when that evaluation cannot stop the run: no node trains a round the run then drops (the wire
    log counts the training replies; without the rule this run trains a 4th round on the nodes)."""
    import hetfed.flower.executor as ex

    executors: list = []
    real_start = ex.FlowerExecutor.start

    def start(self, *args, **kwargs):
        executors.append(self)
        return real_start(self, *args, **kwargs)

    monkeypatch.setattr(ex.FlowerExecutor, "start", start)
    wire = tmp_path / "wire.jsonl"
    monkeypatch.setenv("HETFED_FLOWER_WIRE_LOG", str(wire))
    # Ditto at this lr: its best round is the first, so it stops after the third of 8 (rounds 2 and 3 ride)
    cfg = {"methods": [{"name": "m", "algorithm": "ditto"}],
           "train": {**SMALL["train"], "rounds": 8, "patience": 2, "optimizer": {"lr": 1.0}}}
    flower = summary_of(config({**cfg, "flower": {"clients_per_node": 2}}, "flower"), tmp_path / "f")
    compare(flower, summary_of(config(cfg, "vectorised"), tmp_path / "v"))
    (executor,) = executors
    rounds = flower["methods"]["m"]["rounds"]
    assert flower["methods"]["m"]["stopped_early"] and rounds == 3
    assert executor.messages == 2 * (1 + rounds)  # vs 2 × (1 + 2 × rounds) before
    trained = [e for e in map(json.loads, wire.read_text().splitlines()) if e["type"] == "train"]
    assert len(trained) == 2 * rounds
    # the exchange that carried a round counts as that round's time, not as the evaluation's
    m = flower["methods"]["m"]
    assert m["seconds_per_round"] > m["eval_seconds_per_evaluation"], m


def test_the_set_up_question_rides_on_the_first_step_and_reaches_nodes_that_train_nobody_then(tmp_path, monkeypatch):
    """No ``query`` exchange: the run's first step carries the set-up question to every node — packed, one Flower
    array per message — and a node holding none of round 1's two sampled clients still answers it (its clients
    train later); Γ from the summaries and every number are the in-process ones. A method whose server holds rows
    per client (pFedHN: the nodes' messages differ) asks the question alone first, and matches too."""
    import hetfed.flower.executor as ex
    from hetfed.flower.packing import is_packed, unpack
    from hetfed.flower.records import SETUP

    sent: list[list] = []
    real = ex.send_and_receive

    def spy(grid, messages, timeout):
        sent.append([(m.metadata.message_type, is_packed(m.content), SETUP in unpack(m.content)) for m in messages])
        return real(grid, messages, timeout)

    monkeypatch.setattr(ex, "send_and_receive", spy)
    cfg = {"methods": [{"name": "avg", "algorithm": "fedavg"}, {"name": "hn", "algorithm": "pfedhn"}],
           "train": {**SMALL["train"], "clients_per_round": 2}}
    flower = summary_of(config(cfg, "flower"), tmp_path / "f")
    compare(flower, summary_of(config(cfg, "vectorised"), tmp_path / "v"))
    assert flower["methods"]["avg"]["gamma_from_summaries"]["gamma"] == pytest.approx(flower["gamma"], rel=1e-6)
    first_hn = next(i for i, exchange in enumerate(sent) if exchange[0][0] == "query")  # the methods run in turn
    avg, hn = sent[:first_hn], sent[first_hn:]
    # every node asked with round 1's training (2 of them train) — in one exchange, or in more when the Simulation
    # Engine's nodes connect one after another (seen once on a loaded machine: 2 nodes, then the other 2)
    riding = [e for e in avg if any(setup for _, _, setup in e)]
    assert avg[:len(riding)] == riding and [m for e in riding for m in e] == [("train", True, True)] * 4, avg
    assert all(kind != "query" and not setup for exchange in avg[len(riding):] for kind, _, setup in exchange)
    assert hn[0] == [("query", True, False)] * 4 and all(packed for e in sent for _, packed, _ in e)

def test_the_bilstm_on_token_ids_gives_the_vectorised_numbers_on_flower(tmp_path):
    """FedMoE's text model travels as Flower records like any other: same numbers as in process."""
    from tests.data.test_text_data import write_fortunes

    write_fortunes(tmp_path / "f", per_category=20)
    text = {"dataset": {"name": "fortunes", "data_dir": str(tmp_path / "f")},
            "embed": {"kind": "tokens", "max_length": 8, "vocab_size": 60, "cache_dir": str(tmp_path / "c")},
            "model": {"kind": "bilstm", "embedding_dim": 6, "lstm_hidden": 4},
            "partition": {"kind": "iid", "clients": 3},
            "methods": [{"name": "bilstm", "algorithm": "fedavg"}]}
    compare(summary_of(config(text, "flower"), tmp_path / "fl"), summary_of(config(text, "vectorised"), tmp_path / "v"))
