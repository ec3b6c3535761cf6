"""NIID-Bench's label-count skew (``pathological``: each client exactly #C = k classes) and quantity skew
(``quantity``: Dirichlet sizes, labels at random) — the first checked against Flower Datasets' own
``PathologicalPartitioner`` (Flower's reference for it), both by their invariants and through ``hetfed partition``."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetfed.cli import main
from hetfed.config import PartitionConfig
from hetfed.errors import PartitionError
from hetfed.partition import partition_indices
from hetfed.partition.pathological import pathological
from hetfed.partition.quantity import quantity

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _labels(n: int, classes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, classes, n).astype(np.int64)


def _cover(parts: list[np.ndarray], n: int) -> None:
    flat = np.concatenate(parts)
    assert np.array_equal(np.sort(flat), np.arange(n)), "every sample held by exactly one client"


def _flower(y: np.ndarray, clients: int, per: int, mode: str, seed: int) -> tuple[list[set[int]], bool]:
    """Flower Datasets' partitions of labels ``y`` (each as its sample indices), and whether it left classes out."""
    from datasets import Dataset
    from flwr_datasets.partitioner import PathologicalPartitioner

    p = PathologicalPartitioner(num_partitions=clients, partition_by="label", num_classes_per_partition=per,
                                class_assignment_mode=mode, seed=seed)
    p.dataset = Dataset.from_dict({"label": y.tolist(), "i": list(range(len(y)))})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        parts = [set(p.load_partition(k)["i"]) for k in range(clients)]
    return parts, any("will NOT be used" in str(w.message) for w in caught)


@pytest.mark.parametrize("mode", ["first-deterministic", "deterministic", "random"])
@pytest.mark.parametrize("clients,per,classes", [(10, 2, 10), (13, 3, 10), (25, 1, 10), (6, 4, 5), (4, 2, 10)])
def test_pathological_gives_flower_datasets_partitions_and_refuses_where_it_leaves_classes_out(mode, clients, per,
                                                                                             classes):
    pytest.importorskip("flwr_datasets", reason="flwr-datasets is part of the test extra")
    for seed in (0, 7):
        y = _labels(400, classes, seed)
        theirs, left_out = _flower(y, clients, per, mode, seed)
        cfg = PartitionConfig(kind="pathological", clients=clients, classes_per_client=per, assignment=mode)
        if left_out:
            with pytest.raises(PartitionError, match=r"gives classes \[.*\] to no client .* would be left out"):
                pathological(y[:, None], y, cfg, np.random.default_rng(seed))
            continue
        ours = pathological(y[:, None], y, cfg, np.random.default_rng(seed))
        assert [set(p.tolist()) for p in ours] == theirs, (mode, clients, per, seed)


@SETTINGS
@given(clients=st.integers(10, 40), per=st.integers(1, 5), seed=st.integers(0, 999),
       mode=st.sampled_from(["first-deterministic", "deterministic", "random"]))
def test_pathological_gives_each_client_exactly_its_classes_and_each_class_in_equal_parts(clients, per, seed, mode):
    y = _labels(600, 10, seed)
    cfg = PartitionConfig(kind="pathological", clients=clients, classes_per_client=per, assignment=mode)
    try:
        parts = partition_indices(y[:, None], y, cfg, seed)
    except PartitionError as e:  # random classes may leave one to nobody: refused, never silently dropped
        assert mode == "random" and "to no client" in str(e)
        return
    _cover(parts, len(y))
    assert all(len(np.unique(y[p])) == per for p in parts)
    for c in range(10):
        sizes = [int(np.sum(y[p] == c)) for p in parts if np.any(y[p] == c)]
        assert max(sizes) - min(sizes) <= 1, (c, sizes)  # np.array_split over its holders
    assert all(np.array_equal(a, b) for a, b in zip(parts, partition_indices(y[:, None], y, cfg, seed), strict=True))


def test_pathological_refuses_more_classes_than_the_data_has():
    y = _labels(100, 4, 0)
    with pytest.raises(PartitionError, match=r"classes_per_client = 5 is not allowed: the data has 4 classes"):
        pathological(y[:, None], y, PartitionConfig(kind="pathological", clients=8, classes_per_client=5),
                     np.random.default_rng(0))


@SETTINGS
@given(clients=st.integers(2, 50), beta=st.floats(0.05, 50), floor=st.integers(0, 20), seed=st.integers(0, 999))
def test_quantity_sizes_are_dirichlet_shares_above_the_floor_and_cover_the_pool(clients, beta, floor, seed):
    y = _labels(1000, 10, seed)
    cfg = PartitionConfig(kind="quantity", clients=clients, beta=beta, min_size=floor)
    parts = partition_indices(y[:, None], y, cfg, seed)
    _cover(parts, len(y))
    assert min(map(len, parts)) >= floor
    assert all(np.array_equal(a, b) for a, b in zip(parts, partition_indices(y[:, None], y, cfg, seed), strict=True))


def test_quantity_skews_the_sizes_by_beta_and_leaves_the_labels_at_random():
    y = np.sort(_labels(20_000, 10, 0))  # label-sorted: a cut without the shuffle would give a client few classes
    spread = {}
    for beta in (0.1, 100.0):
        parts = partition_indices(y[:, None], y, PartitionConfig(kind="quantity", clients=20, beta=beta), 0)
        sizes = np.array([len(p) for p in parts])
        spread[beta] = sizes.std() / sizes.mean()
        big = max(parts, key=len)  # its label mix is the pool's, up to sampling
        assert np.abs(np.bincount(y[big], minlength=10) / len(big) - 0.1).max() < 0.03
    assert spread[0.1] > 1.0 > 0.2 > spread[100.0], spread


def test_quantity_refuses_a_floor_the_pool_cannot_give():
    y = _labels(100, 4, 0)
    with pytest.raises(PartitionError, match=r"min_size = 30 is not allowed with 4 clients: it needs 120 samples"):
        quantity(y[:, None], y, PartitionConfig(kind="quantity", clients=4, min_size=30), np.random.default_rng(0))


def test_gammas_excess_over_its_iid_reference_is_label_skew_not_client_size(capsys):
    """Through ``hetfed partition``: clients that differ only in size are as heterogeneous as an IID split of the same
    sizes (ΔΓ ≈ 0), while clients of two classes each are far from it — what ΔΓ is documented to separate."""
    excess = {}
    for kind, extra in (("quantity", ["partition.beta=0.3"]), ("pathological", [])):
        sets = ["partition.kind=" + kind, "partition.clients=10", *extra]
        assert main(["partition", "--json", *(a for s in sets for a in ("--set", s))]) == 0
        out = json.loads(capsys.readouterr().out)
        sizes = [c["size"] for c in out["clients"]]
        excess[kind] = (out["gamma_excess"], out["gamma_iid_sd"], max(sizes) / min(sizes))
    q, p = excess["quantity"], excess["pathological"]
    assert q[2] > 5, q  # the sizes are skewed
    assert abs(q[0]) < 0.1 * p[0] and p[0] > 1.0, excess


# --- noise-based feature skew (partition.feature_noise, beside any kind) -------------------------------------------


def _pool(n: int = 600, d: int = 6, seed: int = 0):
    from types import SimpleNamespace

    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n).astype(np.int64)
    return SimpleNamespace(x_train=rng.normal(size=(n, d)).astype(np.float32), y_train=y,
                           x_test=rng.normal(size=(90, d)).astype(np.float32), y_test=np.repeat(np.arange(3), 30),
                           n_classes=3)


def test_feature_noise_grows_with_the_client_and_leaves_the_shared_pool_and_the_global_test_set_alone():
    from hetfed.partition import make_federation

    data = _pool()
    before = data.x_train.copy()
    clean = make_federation(data, PartitionConfig(kind="iid", clients=5), seed=3)
    noisy = make_federation(data, PartitionConfig(kind="iid", clients=5, feature_noise=2.0), seed=3)
    assert np.array_equal(data.x_train, before)  # a copy: a sweep's runs share the pool
    assert np.array_equal(noisy.x_global_test, clean.x_global_test)
    assert all(np.array_equal(a, b) for a, b in zip(noisy.train, clean.train, strict=True))  # the same clients
    for k in range(5):
        rows = np.concatenate([noisy.train[k], noisy.val[k], noisy.test[k]])
        shift = (noisy.x[rows] - clean.x[rows]).ravel()
        assert shift.std() == pytest.approx(2.0 * k / 4, rel=0.15, abs=1e-12), k  # client 0 clean, the last 2.0
    again = make_federation(data, PartitionConfig(kind="iid", clients=5, feature_noise=2.0), seed=3)
    assert np.array_equal(again.x, noisy.x)


def test_feature_noise_is_refused_on_inputs_that_are_not_features_and_where_it_would_skew_nothing():
    from hetfed.partition import make_federation

    data = _pool()
    data.measure_train = data.x_train  # token ids, measured through their bag of words
    with pytest.raises(PartitionError, match=r"partition.feature_noise = 1.0 is not allowed with embed.kind = .*: "
                                             r"its inputs are not features"):
        make_federation(data, PartitionConfig(kind="iid", clients=4, feature_noise=1.0), seed=0)
    data.measure_train = None
    with pytest.raises(PartitionError, match=r"feature_noise = 1.0 is not allowed with one client: client 0's"):
        make_federation(data, PartitionConfig(kind="iid", clients=1, feature_noise=1.0), seed=0)


def test_gamma_measures_noise_based_feature_skew(capsys):
    """Through ``hetfed partition`` on an IID split: Γ's excess over its IID reference grows with the noise."""
    excess = []
    for noise in (0.0, 0.3, 1.0):
        sets = ["partition.kind=iid", f"partition.feature_noise={noise}"]
        assert main(["partition", "--json", *(a for s in sets for a in ("--set", s))]) == 0
        out = json.loads(capsys.readouterr().out)
        excess.append(out["gamma_excess"] / out["gamma_iid_sd"])
    assert abs(excess[0]) < 5 < excess[1] < excess[2], excess
