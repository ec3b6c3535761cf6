"""Flower's Simulation Engine on an existing Ray cluster (``flower.ray_address``, #50 §4): a head and a second raylet
on this machine, 4 cohort nodes of 2 clients; the ClientApps run on both Ray nodes and the numbers are the in-process
ones."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr", reason="the flower extra is part of the test extra")
ray = pytest.importorskip("ray")

from tests.flower_compare import SMALL, compare, config, summary_of  # noqa: E402

pytestmark = pytest.mark.slow


def _client_app_nodes(address: str) -> set[str]:
    """The Ray nodes that hosted Flower's ClientApp actors (from the cluster's actor table, dead ones included)."""
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    try:
        table = ray._private.state.actors()  # the GCS's table: no dashboard needed
        return {a["Address"]["NodeID"] for a in table.values() if a["ActorClassName"] == "ClientAppActor"}
    finally:
        ray.shutdown()


def test_the_simulation_engine_runs_its_client_apps_on_every_node_of_a_ray_cluster(tmp_path, monkeypatch):
    from ray.cluster_utils import Cluster

    monkeypatch.setenv("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    small = {**SMALL, "partition": {**SMALL["partition"], "clients": 8}}
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "object_store_memory": 80 * 2**20})
    try:
        cluster.add_node(num_cpus=1, object_store_memory=80 * 2**20)
        cluster.wait_for_nodes()
        extra = {"flower": {"clients_per_node": 2, "client_cpus": 1, "ray_address": cluster.address}}
        cfg = config({**small, **extra, "methods": [{"name": "fedavg", "algorithm": "fedavg"}]}, "flower")
        flower = summary_of(cfg, tmp_path / "f")
        nodes = _client_app_nodes(cluster.address)
        assert len(nodes) == 2, nodes  # one ClientApp actor per raylet: both hosted clients
    finally:
        cluster.shutdown()
    fedavg = {"methods": [{"name": "fedavg", "algorithm": "fedavg"}]}
    vec = summary_of(config({**small, **fedavg}, "vectorised"), tmp_path / "v")
    compare(flower, vec)
