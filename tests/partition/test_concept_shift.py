"""Concept shift beside any partitioner (hetfed.partition.shift): ``partition.rotations`` (IFCA's rotated MNIST,
CFL's 180° half) and ``partition.label_swaps`` — each client's samples as the papers' code makes them, the shared
pool and the global test set untouched, refusals in one line."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.cli import main
from hetfed.config import PartitionConfig, build_config
from hetfed.errors import ConfigError, PartitionError
from hetfed.partition import make_federation
from hetfed.partition.shift import client_groups, with_label_swaps


def _images(shape: tuple[int, ...], n: int = 240, classes: int = 4, seed: int = 0) -> SimpleNamespace:
    rng = np.random.default_rng(seed)
    d = int(np.prod(shape))
    return SimpleNamespace(x_train=rng.random((n, d), dtype=np.float32), y_train=rng.integers(0, classes, n),
                           x_test=rng.random((8 * classes, d), dtype=np.float32),
                           y_test=np.repeat(np.arange(classes), 8), n_classes=classes, input_shape=shape,
                           extractor="identity", name="toy")


def _rows(fed, k: int) -> np.ndarray:
    return np.sort(np.concatenate([fed.train[k], fed.val[k], fed.test[k]]))


@settings(max_examples=30, deadline=None)
@given(k=st.integers(2, 9), data=st.data(), shape=st.sampled_from([(5, 5), (1, 4, 4), (2, 3, 3)]))
def test_rotated_clients_are_what_ifcas_code_makes_of_them(k, data, shape):
    """Client k of group g (⌊k·G/K⌋) holds its own samples turned as IFCA's ``load_data`` turns them:
    ``torch.rot90(X, k=angle // 90, dims=(1, 2))`` on the image axes; the same clients and splits as without."""
    angles = data.draw(st.lists(st.sampled_from([0, 90, 180, 270]), min_size=2, max_size=k))
    pool = _images(shape)
    before = pool.x_train.copy()
    plain = make_federation(pool, PartitionConfig(kind="iid", clients=k), seed=1)
    fed = make_federation(pool, PartitionConfig(kind="iid", clients=k, rotations=angles), seed=1)
    assert np.array_equal(pool.x_train, before)  # a copy: a sweep's runs share the pool
    assert np.array_equal(fed.x_global_test, plain.x_global_test)
    assert all(np.array_equal(a, b) for a, b in zip(fed.train, plain.train, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(fed.test, plain.test, strict=True))
    for client in range(k):
        rows = _rows(fed, client)
        group = client * len(angles) // k
        images = torch.from_numpy(before[rows].reshape(len(rows), *shape))
        turned = torch.rot90(images, k=angles[group] // 90, dims=(-2, -1)).reshape(len(rows), -1).numpy()
        assert np.array_equal(fed.x[rows], turned), (client, angles)


def test_the_groups_are_ifcas_clusters_and_cfls_first_half():
    """IFCA assigns machine m_i to cluster ⌊m_i / (m/p)⌋ (``cluster_assign`` in blocks of m/p); CFL's example
    rotates clients ``i < 0.5 · N``: group 0 of two."""
    for m, p in ((2400, 4), (12, 3), (8, 2)):
        assert np.array_equal(client_groups(m, p), np.repeat(np.arange(p), m // p))
    for n in range(2, 30):
        assert np.array_equal(client_groups(n, 2) == 0, np.arange(n) < 0.5 * n), n


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 200), g=st.integers(1, 200))
def test_groups_are_contiguous_near_equal_and_none_empty(n, g):
    g = min(g, n)
    groups = client_groups(n, g)
    sizes = np.bincount(groups, minlength=g)
    assert np.all(np.diff(groups) >= 0) and len(sizes) == g and sizes.min() >= 1 and sizes.max() - sizes.min() <= 1


@settings(max_examples=30, deadline=None)
@given(k=st.integers(2, 8), data=st.data())
def test_swapped_labels_exchange_the_pair_on_the_group_only(k, data):
    pairs = data.draw(st.lists(st.one_of(st.none(), st.lists(st.integers(0, 3), min_size=2, max_size=2, unique=True)),
                               min_size=2, max_size=k))
    pool = _images((4, 4))
    plain = make_federation(pool, PartitionConfig(kind="iid", clients=k), seed=2)
    fed = make_federation(pool, PartitionConfig(kind="iid", clients=k, label_swaps=pairs), seed=2)
    assert np.array_equal(fed.y_global_test, plain.y_global_test) and np.array_equal(fed.x, plain.x)
    for client in range(k):
        rows = _rows(fed, client)
        assert np.array_equal(rows, _rows(plain, client))  # the same samples (their split may differ: by label)
        pair = pairs[client * len(pairs) // k]
        swap = {} if pair is None else {pair[0]: pair[1], pair[1]: pair[0]}
        assert fed.y[rows].tolist() == [swap.get(v, v) for v in pool.y_train[rows].tolist()]
    parts = [_rows(fed, c) for c in range(k)]
    assert np.array_equal(with_label_swaps(fed.y, parts, pairs), pool.y_train)  # a swap undoes itself


def test_refused_where_they_cannot_apply_in_one_line():
    vectors = _images((16,))
    with pytest.raises(PartitionError, match=r"^partition.rotations = \[0, 180\] is not allowed with embed.kind = "
                                             r"'identity' and samples of shape \(16,\): it rotates images"):
        make_federation(vectors, PartitionConfig(kind="iid", clients=4, rotations=[0, 180]), seed=0)
    features = _images((4, 4))
    features.extractor = "efficientnet_lite0"
    with pytest.raises(PartitionError, match="embed.kind = 'efficientnet_lite0'"):
        make_federation(features, PartitionConfig(kind="iid", clients=4, rotations=[0, 180]), seed=0)
    wide = _images((4, 6))
    make_federation(wide, PartitionConfig(kind="iid", clients=4, rotations=[0, 180]), seed=0)  # a half turn fits
    with pytest.raises(PartitionError, match=r"with 4×6 images: a quarter turn changes their shape; expected 0 or"):
        make_federation(wide, PartitionConfig(kind="iid", clients=4, rotations=[0, 90]), seed=0)
    with pytest.raises(PartitionError, match=r"partition.label_swaps = \[\[0, 1\], \[2, 3\], None\] is not allowed "
                                             r"with 2 clients: it names 3 groups"):
        make_federation(features, PartitionConfig(kind="iid", clients=2, label_swaps=[[0, 1], [2, 3], None]), seed=0)
    with pytest.raises(PartitionError, match=r"names label 7, which 'toy' does not have: expected labels 0 … 3"):
        make_federation(features, PartitionConfig(kind="iid", clients=4, label_swaps=[None, [1, 7]]), seed=0)
    for raw, needle in (({"rotations": [0, 45]}, "partition.rotations.1 = 45: Input should be 0, 90, 180 or 270"),
                        ({"rotations": [90]}, "at least 2 items"),
                        ({"label_swaps": [None, [2, 2]]}, "swaps label 2 with itself, which exchanges nothing")):
        with pytest.raises(ConfigError, match=needle):
            build_config({"partition": raw})


def test_hetfed_run_refuses_a_label_the_data_lacks_with_exit_2_and_nothing_written(tmp_path, capsys):
    out = tmp_path / "r"
    assert main(["run", "--set", "partition.label_swaps=[null, [3, 10]]", "--out", str(out)]) == 2
    assert "partition.label_swaps = [None, [3, 10]] names label 10, which 'digits'" in capsys.readouterr().err
    assert not out.exists()


def test_gamma_sees_rotated_clients_and_not_swapped_labels(capsys):
    """Through ``hetfed partition`` on an IID split of digits: Γ measures the clients' features, so a rotation is a
    large excess over its IID reference and a label swap none — concept shift in the labels is invisible to Γ."""
    excess = {}
    for name, key in (("rotations", "partition.rotations=[0, 90, 180, 270]"),
                      ("label_swaps", "partition.label_swaps=[null, [0, 1], [2, 3], [4, 5]]")):
        assert main(["partition", "--json", "--set", "partition.kind=iid", "--set", key]) == 0
        out = json.loads(capsys.readouterr().out)
        excess[name] = out["gamma_excess"] / out["gamma_iid_sd"]
    assert excess["rotations"] > 50 and abs(excess["label_swaps"]) < 5, excess


def test_hetfed_partition_names_each_clients_concept(capsys):
    sets = ["--set", "partition.kind=iid", "--set", "partition.rotations=[0, 180]",
            "--set", "partition.label_swaps=[null, [1, 7], null]"]
    assert main(["partition", "--json", *sets]) == 0
    concepts = [c["concept"] for c in json.loads(capsys.readouterr().out)["clients"]]
    assert concepts == ["as is"] * 4 + ["labels 1↔7", *["turned 180°, labels 1↔7"] * 2, *["turned 180°"] * 3]
    assert main(["partition", *sets]) == 0
    assert "turned 180°, labels 1↔7" in capsys.readouterr().out
    assert main(["partition", "--json", "--set", "partition.kind=iid"]) == 0
    assert not any("concept" in c for c in json.loads(capsys.readouterr().out)["clients"])
