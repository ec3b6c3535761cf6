"""What a method's server found, each round (``Algorithm.findings``): whether a clustered method found the clients'
concepts — ``clusters`` and ``cluster_ari`` (the adjusted Rand index of its clusters against the concept groups
``partition.rotations`` / ``label_swaps`` made) —, CFL's update norms and Agnostic FL's λ, in metrics.csv, the run's
summary and a sweep's runs.csv."""

from __future__ import annotations

import csv
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import adjusted_rand_score

from hetfed.config import build_config
from hetfed.engine.types import Upload
from hetfed.executors.simulate import _findings
from hetfed.partition.shift import concept_groups
from hetfed.runs.sweep_tables import run_values


def test_a_concept_is_what_is_done_to_a_client_not_its_group_number():
    assert concept_groups(8, {"rotations": None, "label_swaps": None}) is None
    assert concept_groups(8, {}) is None
    same_angle = concept_groups(8, {"rotations": [0, 90, 0, 90]})  # groups 0 and 2 are one concept
    assert same_angle.tolist() == [0, 0, 1, 1, 0, 0, 1, 1]
    both = concept_groups(8, {"rotations": [0, 180], "label_swaps": [None, [0, 1], None, [0, 1]]})
    assert adjusted_rand_score(both, [0, 0, 1, 1, 2, 2, 3, 3]) == 1.0
    swapped = concept_groups(6, {"label_swaps": [[1, 2], [2, 1], None]})  # one pair either way: two concepts
    assert len(set(swapped.tolist())) == 3  # [1, 2] and [2, 1] name the same exchange but are kept apart


def test_the_round_scores_the_clusters_of_the_clients_that_uploaded_against_their_concepts():
    clusters = torch.tensor([0, 0, 1, 1, 1])
    concepts = concept_groups(8, {"rotations": [0, 90, 0, 90], "label_swaps": None})
    loop = SimpleNamespace(algo=SimpleNamespace(findings=lambda server, upload: {"clusters": clusters, "norm": 0.5},
                                                spec=SimpleNamespace(name="m")),
                           concepts=concepts, fed=SimpleNamespace(n_clients=8))
    upload = Upload([0, 2, 4, 6, 7], {}, torch.ones(5))
    out, per_client = _findings(loop, None, upload)
    # clients 0, 2, 4, 6, 7 are turned 0, 90, 0, 90, 90 degrees
    assert out == {"clusters": 2.0, "norm": 0.5,
                   "cluster_ari": pytest.approx(adjusted_rand_score([0, 1, 0, 1, 1], [0, 0, 1, 1, 1]))}
    assert per_client == {}
    loop.concepts = None
    assert _findings(loop, None, upload) == ({"clusters": 2.0, "norm": 0.5}, {})  # no concepts: how many clusters
    loop.algo.findings = lambda server, upload: {"norm": torch.tensor(0.25)}
    assert _findings(loop, None, upload) == ({"norm": 0.25}, {})  # not a clustered method: its numbers as floats
    loop.algo.findings = lambda server, upload: {}
    assert _findings(loop, None, upload) == ({}, {})
    # one value a client of the federation: what it found of each client, as a list by client id
    loop.algo.findings = lambda server, upload: {"w": torch.arange(8) / 28.0, "top": 7.0}
    assert _findings(loop, None, upload) == ({"top": 7.0}, {"w": (torch.arange(8) / 28.0).tolist()})
    loop.algo.findings = lambda server, upload: {"w": torch.ones(5)}  # the round's clients only: refused
    with pytest.raises(ValueError, match=r"m: findings\['w'\] holds 5 values; .* one a client of the federation \(8\)"):
        _findings(loop, None, upload)


def test_ifca_and_cfl_report_their_clusters_every_round_and_fedavg_none(tmp_path):
    from hetfed.runs.runner import run_experiment

    raw = {"partition": {"kind": "iid", "clients": 6, "rotations": [0, 180]},
           "train": {"rounds": 3, "local_steps": 2, "batch_size": 16},
           "methods": [{"algorithm": "fedavg"}, {"name": "ifca", "algorithm": "ifca", "params": {"clusters": 2}},
                       {"name": "cfl", "algorithm": "cfl",  # split at once: any cluster whose largest update moves
                        "params": {"eps1": 1e6, "eps2": 1e-9, "warmup_rounds": 0}}]}
    out = tmp_path / "r"
    whole = run_experiment(build_config(raw), out=out, progress=False).summary
    summary = whole["methods"]
    rows: dict[tuple[str, str], dict[int, float]] = {}
    with open(out / "metrics.csv") as fh:
        for r in csv.DictReader(fh):
            if r["metric"] in ("clusters", "cluster_ari"):
                assert r["split"] == "train"
                rows.setdefault((r["method"], r["metric"]), {})[int(r["round"])] = float(r["value"])
    assert {m for m, _ in rows} == {"ifca", "cfl"} and "findings" not in summary["fedavg"]
    for method in ("ifca", "cfl"):
        assert sorted(rows[method, "clusters"]) == [1, 2, 3]
        assert all(-0.5 <= v <= 1.0 for v in rows[method, "cluster_ari"].values())
        found = summary[method]["findings"]
        assert {k: found[k] for k in ("clusters", "cluster_ari")} == {"clusters": rows[method, "clusters"][3],
                                                                      "cluster_ari": rows[method, "cluster_ari"][3]}
    assert rows["cfl", "clusters"][1] == 2.0  # its one cluster split in two at the first round
    assert all(1.0 <= v <= 2.0 for v in rows["ifca", "clusters"].values())
    listed = {(m, k): v for m, k, v in run_values(whole)}
    assert listed["cfl", "findings.cluster_ari"] == summary["cfl"]["findings"]["cluster_ari"]
    assert not any(k.startswith("findings.") for m, k in listed if m == "fedavg")
    from hetfed.runs.summary import findings_line

    found = summary["cfl"]["findings"]
    assert findings_line("cfl", summary["cfl"]) == (
        f"found (cfl), the last round: clients in {int(found['clusters'])} clusters, adjusted Rand index against the "
        f"clients' concepts {found['cluster_ari']:.2f} (1: exactly); update_norm_mean {found['update_norm_mean']:.4g}; "
        f"update_norm_max {found['update_norm_max']:.4g}")
    assert findings_line("ifca", summary["ifca"]).startswith("found (ifca), the last round: clients in ")
    assert findings_line("fedavg", summary["fedavg"]) is None


def test_cfl_and_ifca_name_each_uploading_clients_cluster():
    from hetfed.algorithms import build_algorithm
    from hetfed.config import ModelConfig, TrainConfig
    from hetfed.engine.types import ServerState
    from hetfed.models import build_model

    model = build_model(ModelConfig(kind="mlp", hidden=[4]), (3,), 2)
    train = TrainConfig()
    ifca = build_algorithm("ifca", model, train, {"clusters": 3})
    upload = Upload([4, 1], {}, torch.ones(2), extra={"cluster": torch.tensor([2.0, 0.0])})
    assert ifca.findings(ServerState({}), upload)["clusters"].tolist() == [2, 0]
    cfl = build_algorithm("cfl", model, train, {})
    state = ServerState({}, extra={"cfl.cluster_of": torch.tensor([0.0, 1.0, 1.0, 0.0])})
    assert cfl.findings(state, Upload([2, 0, 5], {}, torch.ones(3)))["clusters"].tolist() == [1, 0, 0]  # 5: not
    assert build_algorithm("fedavg", model, train, {}).findings(state, upload) == {}  # known yet: 0
    assert np.array_equal(concept_groups(4, {"rotations": [0, 90, 180, 270]}), np.arange(4))


@settings(max_examples=40, deadline=None)
@given(m=st.integers(3, 7), seed=st.integers(0, 2**31 - 1), shift=st.floats(0.0, 3.0))
def test_cfl_reads_its_norms_and_similarities_from_the_updates_gram_matrix_as_the_authors_code_does(m, seed, shift):
    """CFL's server reads the updates' Gram matrix, summed parameter by parameter (no float64 copy of the whole
    round's updates); its norms and its split are those of the authors' code (felisat/clustered-federated-learning:
    ``compute_mean_update_norm``, ``compute_max_update_norm``, ``pairwise_angles`` on the flattened updates,
    ``cluster_clients``), for updates of several parameters that share a direction up to ``shift``."""
    from sklearn.cluster import AgglomerativeClustering

    from hetfed.algorithms.cfl import bipartition, gram_norms, update_gram

    gen = torch.Generator().manual_seed(seed)
    shapes = [(4, 3), (4,), (2, 2, 2)]
    common = [torch.randn(s, generator=gen) for s in shapes]
    deltas = [torch.stack([c * shift + torch.randn(c.shape, generator=gen) for _ in range(m)]) for c in common]
    flat = torch.cat([d.flatten(1) for d in deltas], 1).double()  # the authors' flatten(client.dW), a row a client
    mean_norm, max_norm = gram_norms(update_gram(deltas))
    assert mean_norm == pytest.approx(float(flat.mean(0).norm()), rel=1e-5)
    assert max_norm == pytest.approx(max(float(row.norm()) for row in flat), rel=1e-5)
    angles = torch.stack([torch.stack([(a * b).sum() / (a.norm() * b.norm() + 1e-12) for b in flat]) for a in flat])
    theirs = AgglomerativeClustering(metric="precomputed", linkage="complete").fit(-angles.numpy()).labels_
    ours = bipartition(update_gram(deltas))
    assert sorted(map(sorted, ours)) == sorted(sorted(np.flatnonzero(theirs == c).tolist()) for c in (0, 1))
