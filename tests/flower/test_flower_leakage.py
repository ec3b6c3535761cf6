"""What the server learns on Flower (#76): an inversion attack reads what the ServerApp really receives of the chosen
client — its node's reply decoded, its cohort's mean where the node summed it, only the round's mean under SecAgg+ —
and a membership attack queries the server's own model (the personal models stay on the nodes)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

pytest.importorskip("flwr", reason="the flower extra is part of the test extra")

from hetfed.config import build_config  # noqa: E402
from hetfed.engine.types import Seen, StreamedUpload, Upload  # noqa: E402
from hetfed.errors import ConfigError  # noqa: E402
from tests.one_actor import ONE_ACTOR  # noqa: E402

SMALL = {
    "partition": {"kind": "feature_clusters", "clients": 4},
    "train": {"rounds": 1, "local_steps": 2, "batch_size": 8, "eval_every": 1},
    "methods": [{"name": "fedavg", "algorithm": "fedavg"}],
    "leakage": {"kind": "label_counts", "client": 2, "round": 1},
}


def _config(executor: str, **flower) -> object:
    raw = json.loads(json.dumps(SMALL))
    raw["train"]["executor"] = executor
    raw["flower"] = {"connect_timeout": 300, **(ONE_ACTOR if executor == "flower" else {}), **flower}
    return build_config(raw)


def test_a_clients_part_of_an_upload_is_its_row_or_the_mean_it_was_summed_in():
    rows = Upload([4, 7], {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]])}, torch.tensor([5.0, 6.0]))
    own = Seen.of(rows, 7)
    assert own.clients == [7] and own.params["w"].tolist() == [[3.0, 4.0]]
    summed = StreamedUpload([4, 7], {}, torch.tensor([5.0, 6.0]), mean={"w": torch.tensor([2.0, 3.0])})
    both = Seen.of(summed, 7)
    assert both.clients == [4, 7] and both.params["w"].tolist() == [[2.0, 3.0]]


def test_an_attack_on_supernodes_own_data_is_refused():
    from hetfed.partition import NodesFederation
    from hetfed.runs import plan

    cfg = _config("flower")
    fed = NodesFederation(np.zeros((0, 1)), np.zeros(0), (np.zeros(0, int),) * 4, (np.zeros(0, int),) * 4,
                          (np.zeros(0, int),) * 4, np.zeros((0, 1)), np.zeros(0), 10, np.zeros(4, bool))
    with pytest.raises(ConfigError, match="leakage.kind = 'label_counts' is not allowed with SuperNodes' own data"):
        plan._check_leakage(cfg, 0, cfg.methods[0], None, None, fed)  # type: ignore[arg-type]


def test_idlg_is_refused_where_the_update_may_come_summed(tmp_path):
    from hetfed.runs.runner import run_experiment

    raw = json.loads(json.dumps(SMALL))
    raw["train"].update(executor="flower", batch_size=1, local_steps=1)
    raw["flower"] = {"secure_aggregation": "secaggplus"}
    raw["leakage"] = {"kind": "idlg"}
    with pytest.raises(ConfigError, match="client 0's update may reach the server summed with others'"):
        run_experiment(build_config(raw), out=tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()


def _spied(monkeypatch) -> list[Seen]:
    """Every :class:`Seen` the run's attack is handed."""
    import hetfed.runs.leakage as leakage

    got: list[Seen] = []
    real = leakage.attack_upload

    def attack(spec, fed, bc, seen, config):
        got.append(seen)
        return real(spec, fed, bc, seen, config)

    monkeypatch.setattr(leakage, "attack_upload", attack)
    return got


def _reference(tmp_path, monkeypatch) -> tuple[dict[int, dict[str, torch.Tensor]], np.ndarray]:
    """Each client's round-1 parameters in process (what it uploads) and the clients' training-sample counts."""
    from hetfed.runs.leakage import InversionObserver
    from hetfed.runs.runner import run_experiment

    per_client: dict[int, dict[str, torch.Tensor]] = {}
    sizes: list[np.ndarray] = []
    real = InversionObserver.sending

    def sending(self, rnd, bc, clients, executor):
        if rnd == 1:
            per_client.update({k: {n: v[0] for n, v in executor.watch(bc, k).params.items()} for k in clients})
            sizes.append(self.fed.train_sizes())
        real(self, rnd, bc, clients, executor)

    monkeypatch.setattr(InversionObserver, "sending", sending)
    summary = run_experiment(_config("vectorised"), out=tmp_path / "vec", progress=False).summary
    monkeypatch.undo()
    assert summary["methods"]["fedavg"]["leakage"]["clients_in_update"] == 1
    return per_client, sizes[0]


def _mean(per_client: dict[int, dict[str, torch.Tensor]], sizes: np.ndarray, clients: list[int]
          ) -> dict[str, torch.Tensor]:
    w = torch.as_tensor(sizes[clients], dtype=torch.float64)
    return {n: sum(w[j] * per_client[k][n].double() for j, k in enumerate(clients)) / w.sum()
            for n in per_client[clients[0]]}


@pytest.mark.slow
def test_on_flower_the_attack_reads_the_nodes_reply_or_only_secaggs_round_mean(tmp_path, monkeypatch):
    from hetfed.flower.secure import error_bound
    from hetfed.runs.runner import run_experiment

    per_client, sizes = _reference(tmp_path, monkeypatch)

    # two clients a node: the node sends its cohort's weighted mean, and that is all the server has of client 2
    seen = _spied(monkeypatch)
    summary = run_experiment(_config("flower", clients_per_node=2), out=tmp_path / "nodes", progress=False).summary
    found = summary["methods"]["fedavg"]["leakage"]
    assert found["sent"] == 1 and found["clients_in_update"] == 2 and 0 <= found["labels_recovered"] <= 1
    assert len(seen) == 1 and seen[0].clients == [2, 3]
    for name, value in _mean(per_client, sizes, [2, 3]).items():
        torch.testing.assert_close(seen[0].params[name][0].double(), value, rtol=1e-5, atol=1e-6)
    monkeypatch.undo()

    # SecAgg+: the server holds the round's mean alone; the attack is handed that, over every client's samples
    seen = _spied(monkeypatch)
    cfg = _config("flower", secure_aggregation="secaggplus")
    summary = run_experiment(cfg, out=tmp_path / "secure", progress=False).summary
    found = summary["methods"]["fedavg"]["leakage"]
    assert found["sent"] == 1 and found["clients_in_update"] == 4
    assert len(seen) == 1 and seen[0].clients == [0, 1, 2, 3]
    bound = error_bound(cfg.flower.secaggplus, [float(s) for s in sizes], float(sizes.max()))
    for name, value in _mean(per_client, sizes, [0, 1, 2, 3]).items():
        assert float((seen[0].params[name][0].double() - value).abs().max()) <= bound + 1e-6, name


@pytest.mark.slow
def test_on_flower_a_membership_attack_queries_the_servers_model_alone(tmp_path):
    """The server's model on the clients' members and others, as in process; the clients' own models (CGAU's rows)
    stay on the nodes, so no ``personal_*``."""
    from hetfed.runs.runner import run_experiment

    raw = json.loads(json.dumps(SMALL))
    raw["train"]["rounds"] = 2
    raw["methods"] = [{"name": "fedavg", "algorithm": "fedavg"},
                      {"name": "cgau", "algorithm": "fedavg", "model": {"kind": "cgau", "hidden": [16]}}]
    raw["leakage"] = {"kind": "loss_threshold", "samples": 200}
    found = {}
    for executor in ("vectorised", "flower"):
        raw["train"]["executor"] = executor
        summary = run_experiment(build_config(raw), out=tmp_path / executor, progress=False).summary
        found[executor] = {row: m["leakage"] for row, m in summary["methods"].items()}
    assert "personal_auc" in found["vectorised"]["cgau"] and "personal_auc" not in found["flower"]["cgau"]
    for row in ("fedavg", "cgau"):
        assert found["flower"][row]["global_auc"] == pytest.approx(found["vectorised"][row]["global_auc"], abs=1e-3)
