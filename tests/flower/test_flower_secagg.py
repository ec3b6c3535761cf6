"""Secure aggregation with Flower's SecAgg+ (``flower.secure_aggregation: secaggplus``): the server sees only the
masked sum, gets the plain run's weighted mean within the quantisation error SecAgg+'s parameters imply, and a node
that drops out mid-protocol (within the threshold) does not stop the round. Simulation Engine and a loopback
deployment; the refusals (methods and settings that need individual updates) in-process."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr", reason="the flower extra is part of the test extra")

from hetfed.config import build_config  # noqa: E402
from hetfed.errors import ConfigError  # noqa: E402
from tests.one_actor import ONE_ACTOR  # noqa: E402

SMALL = {
    "partition": {"kind": "feature_clusters", "clients": 4},
    "train": {"rounds": 2, "local_steps": 4, "batch_size": 16, "eval_every": 1},
    "methods": [{"name": "fedavg", "algorithm": "fedavg"}],
}


def _config(executor: str, secure: bool, **extra) -> object:
    raw = json.loads(json.dumps({**SMALL, **extra}))
    raw["train"]["executor"] = executor
    raw.setdefault("flower", {}).update(connect_timeout=300, **({"secure_aggregation": "secaggplus"} if secure else {}))
    if executor == "flower":
        raw["flower"] = {**ONE_ACTOR, **raw["flower"]}
    return build_config(raw)


# --------------------------------------------------------------------------------------------- refusals


@pytest.mark.parametrize("change,expected", [
    ({"methods": [{"algorithm": "scaffold"}]}, "methods.0.algorithm = 'scaffold' is not allowed"),
    ({"server": {"combine": {"rule": "median"}}}, "server.combine.rule = 'median' is not allowed"),
    ({"server": {"screen": {"norm_factor": 3}}}, "server.screen.norm_factor = 3.0 is not allowed"),
    ({"server": {"compression": {"kind": "qsgd", "bits": 8}}}, "server.compression = {'kind': 'qsgd', 'bits': 8} is "
                                                               "not allowed"),
    ({"privacy": {"noise_multiplier": 1.0, "clip": 1.0}}, "privacy.noise_multiplier = 1 is not allowed"),
])
def test_methods_and_settings_that_need_individual_updates_are_refused_before_training(tmp_path, change, expected):
    from hetfed.runs.runner import run_experiment

    cfg = _config("flower", True, **change)
    with pytest.raises(ConfigError, match=expected.replace(".", r"\.").replace("(", r"\(")):
        run_experiment(cfg, out=tmp_path / "r", progress=False)
    assert not (tmp_path / "r" / "metrics.csv").exists()


def test_settings_nothing_reads_are_noted():
    from hetfed.config import unread_keys

    assert set(unread_keys(_config("vectorised", True))) == {"flower.secure_aggregation", "flower.connect_timeout"}
    assert set(unread_keys(_config("flower", False, flower={"secaggplus": {"num_shares": 5}}))) == {
        "flower.secaggplus.num_shares"}
    assert unread_keys(_config("flower", True, flower={"secaggplus": {"num_shares": 5}})) == {}


def test_the_error_bound_is_one_quantisation_step_per_node_over_the_weight():
    from hetfed.config import SecAggPlusConfig
    from hetfed.flower.secure import error_bound

    p = SecAggPlusConfig(clipping_range=8.0, quantization_bits=22)
    assert error_bound(p, [100.0, 100.0], 100.0) == pytest.approx(2 * (16 / 2 ** 22) / 2)


# -------------------------------------------------------------------------------- the Simulation Engine


def _recorded(monkeypatch, drop_client: int | None = None):
    """Patch the server's messaging: keep every reply the ServerApp receives, every round's upload, and — given
    ``drop_client`` — lose the round-0 training reply of the node that holds it (a node that drops out after the
    key exchange, in the secure run)."""
    import hetfed.flower.executor as ex
    from hetfed.flower.packing import unpack
    from hetfed.flower.records import CLIENTS, SETUP, records_to_upload

    seen: dict = {"replies": [], "uploads": {}, "executor": None}
    real_send, real_train = ex.send_and_receive, ex.FlowerExecutor.train

    def send(grid, messages, timeout):
        replies = real_send(grid, messages, timeout)
        lost = set()
        round_0 = [m for m in messages if m.metadata.message_type == "train" and m.metadata.group_id == "0"]
        for m in round_0 if drop_client is not None else []:
            c = unpack(m.content)
            if SETUP in c:  # the set-up question rides on round 0: the message names every client of the round,
                continue    # and the reply of the node holding drop_client says it (below)
            if CLIENTS in c and drop_client in list(c.config_records[CLIENTS]["ids"]):
                lost.add(m.metadata.dst_node_id)
        riding = {m.metadata.dst_node_id for m in round_0 if SETUP in unpack(m.content)}
        for r in replies:
            c = unpack(r.content) if r.metadata.src_node_id in riding and r.has_content() else None
            if c is not None and "upload" in c and drop_client in records_to_upload(c).client_ids:
                lost.add(r.metadata.src_node_id)
        kept = [r for r in replies if r.metadata.src_node_id not in lost]
        seen["replies"] += kept
        return kept

    def train(self, bc, clients):
        seen["executor"] = self
        upload = real_train(self, bc, clients)
        seen["uploads"][bc.round] = upload
        return upload

    monkeypatch.setattr(ex, "send_and_receive", send)
    monkeypatch.setattr(ex.FlowerExecutor, "train", train)
    return seen


@pytest.mark.slow
def test_secaggplus_on_the_simulation_engine_sums_what_the_plain_run_averages_and_survives_a_dropout(
        tmp_path, monkeypatch):
    from hetfed.flower.secure import error_bound
    from hetfed.runs.runner import run_experiment

    plain = _recorded(monkeypatch, drop_client=3)
    plain_summary = run_experiment(_config("flower", False), out=tmp_path / "plain", progress=False).summary
    monkeypatch.undo()
    secure = _recorded(monkeypatch, drop_client=3)
    cfg = _config("flower", True)
    summary = run_experiment(cfg, out=tmp_path / "secure", progress=False).summary

    # the node that dropped out after sharing its keys is counted as failed; the round went on with the others
    for s in (plain_summary, summary):
        failed = s["methods"]["fedavg"]["failed_clients"]
        assert [(f["step"], f["round"], f["clients"]) for f in failed] == [("train", 0, [3])], failed
        assert s["methods"]["fedavg"]["rounds"] == 2

    # round 0 started from the same model in both runs: SecAgg+'s mean is the plain mean within its bound
    a, b = secure["uploads"][0], plain["uploads"][0]
    assert a.client_ids == b.client_ids == [0, 1, 2]
    assert a.num_samples.tolist() == b.num_samples.tolist()
    weights = a.num_samples.tolist()
    sizes = secure["executor"].fed.train_sizes()
    bound = error_bound(cfg.flower.secaggplus, weights, float(max(sizes)))
    w = b.num_samples.double()
    plain_mean = {k: (w.reshape(-1, *[1] * (v.dim() - 1)) * v.double()).sum(0) / w.sum() for k, v in b.params.items()}
    for k, v in plain_mean.items():
        diff = float((a.mean[k].double() - v).abs().max())
        assert diff <= bound + 2e-7 * float(v.abs().max()), (k, diff, bound)
        assert diff > 0 or v.numel() < 10  # quantised: not the plain numbers bit for bit
    assert float(a.extra["train_loss"][0]) == pytest.approx(
        float((b.extra["train_loss"] * b.num_samples).sum() / b.num_samples.sum()), abs=1e-5)

    # the whole runs agree to the quantisation's small drift
    for key in ("global_accuracy", "val_loss", "local_accuracy_mean"):
        assert summary["methods"]["fedavg"]["final"][key] == pytest.approx(
            plain_summary["methods"]["fedavg"]["final"][key], rel=1e-3, abs=1e-4)

    # what the ServerApp received: no array carries anything in any secure reply; the masked vectors look
    # uniform over the modulus, far beyond what a quantised update reaches (< 2**22 per coordinate and node)
    train_replies = [r for r in secure["replies"] if "secaggplus_configs" in r.content.config_records]
    assert train_replies
    for r in train_replies:
        assert all(len(rec) == 0 for rec in r.content.array_records.values())
        assert not {"params", "mean"} & set(r.content.array_records)
    masked = [r.content.config_records["secaggplus_configs"]["masked_params"] for r in train_replies
              if "masked_params" in r.content.config_records["secaggplus_configs"]]
    assert len(masked) == 3 + 4  # round 0: the 3 nodes that stayed; round 1: all 4
    from flwr.common import bytes_to_ndarray

    values = np.concatenate([bytes_to_ndarray(b).ravel() for b in masked[0]]).astype(np.float64)
    assert values.max() > 2 ** 28 and values.std() > 2 ** 29


# ------------------------------------------------------------------------------------ a loopback deployment


@pytest.mark.slow
def test_secaggplus_on_a_loopback_deployment_gives_the_in_process_numbers_and_nodes_send_only_masked_vectors(
        tmp_path, capfd, monkeypatch):
    from hetfed.cli import main
    from hetfed.config import dump_config
    from hetfed.flower.deploy import LocalDeployment
    from hetfed.runs.runner import run_experiment

    wire = tmp_path / "wire.jsonl"
    monkeypatch.setenv("HETFED_FLOWER_WIRE_LOG", str(wire))  # the SuperNodes' ClientApps inherit it
    small = {"partition": {"kind": "feature_clusters", "clients": 2}, "train": {"rounds": 1, "local_steps": 4,
             "batch_size": 16, "eval_every": 1, "executor": "flower"}, "methods": [{"name": "fedavg",
             "algorithm": "fedavg"}], "flower": {"secure_aggregation": "secaggplus", "connect_timeout": 300}}
    with LocalDeployment(tmp_path / "dep", 2) as dep:
        (tmp_path / "s.yaml").write_text(dump_config(build_config(small)))
        assert main(["flower", "run", str(tmp_path / "s.yaml"), "--deployment", str(dep.directory),
                     "--out", str(tmp_path / "run"), "--no-report"]) == 0
    deployed = json.loads((tmp_path / "run" / "summary.json").read_text())
    small["train"]["executor"] = "vectorised"
    small.pop("flower")
    vec = run_experiment(build_config(small), out=tmp_path / "vec", progress=False).summary
    for key in ("global_accuracy", "val_loss", "local_accuracy_mean"):
        assert deployed["methods"]["fedavg"]["final"][key] == pytest.approx(
            vec["methods"]["fedavg"]["final"][key], rel=1e-3, abs=1e-4)
    entries = [json.loads(line) for line in Path(wire).read_text().splitlines()]
    secure = [e for e in entries if e["type"] == "train.secaggplus"]
    assert len(secure) == 4 * 2  # 4 stages × 2 nodes
    assert not [e for e in entries if e["type"] == "train"]  # no plain training reply left a node
    for e in secure:  # a record with arrays left empty; the update never in a reply
        assert not {"params", "mean", "upload"} & set(e["records"])
        assert e["records"].get("fitres.parameters", []) == []
