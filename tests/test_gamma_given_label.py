"""Γ(x|y), the class-conditional Γ (hetfed.heterogeneity.gamma_given_label): per class, Γ over the clients that hold
it, averaged over the classes two or more clients hold — against that definition, blind to label skew, seeing
concept shift, with its size-matched IID reference, and switched off by ``heterogeneity.given_label: false``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.cli import main
from hetfed.heterogeneity import gamma_given_label, gamma_reference, measure


@settings(max_examples=25, deadline=None)
@given(k=st.integers(2, 5), classes=st.integers(1, 4), d=st.integers(1, 4), seed=st.integers(0, 10_000))
def test_it_is_the_mean_over_classes_of_the_definitions_gamma_among_their_holders(k, classes, d, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(12 * k, d))
    y = rng.integers(0, classes, len(x))
    clients = np.array_split(rng.permutation(len(x)), k)
    per_class = []
    for c in range(classes):
        holders = [idx[y[idx] == c] for idx in clients if (y[idx] == c).any()]
        if len(holders) >= 2:
            per_class.append(gamma_reference(x, holders))
    value, _, _ = gamma_given_label(x, y, clients, classes, draws=0)
    if per_class:
        assert value == pytest.approx(np.mean(per_class), rel=1e-7, abs=1e-9)
    else:
        assert np.isnan(value)


def _two_class_pool(n: int = 1600, d: int = 3, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = np.repeat([0, 1], n // 2)
    x = rng.normal(size=(n, d)) + 4.0 * y[:, None]  # each class its own Gaussian
    return x, y, rng


def test_label_skew_alone_moves_gamma_and_not_gamma_given_label_and_swapped_labels_the_other_way():
    x, y, rng = _two_class_pool()
    zeros, ones = rng.permutation(np.flatnonzero(y == 0)), rng.permutation(np.flatnonzero(y == 1))
    # label skew: client 0 holds mostly class 0, client 1 mostly class 1, each class drawn alike on both
    skewed = [np.concatenate([zeros[:700], ones[:100]]), np.concatenate([zeros[700:], ones[100:]])]
    h = measure(x, y, skewed, 2, iid_draws=5, seed=1)
    assert h.gamma - h.gamma_iid > 20 * h.gamma_iid_sd
    assert abs(h.gamma_given_label - h.gamma_given_label_iid) < 5 * h.gamma_given_label_iid_sd + 0.01
    # swapped labels: the same features on both clients, but client 1 calls class 0 "1" and class 1 "0"
    even = [np.concatenate([zeros[:400], ones[:400]]), np.concatenate([zeros[400:], ones[400:]])]
    swapped = y.copy()
    swapped[even[1]] = 1 - y[even[1]]
    h = measure(x, swapped, even, 2, iid_draws=5, seed=1)
    assert abs(h.gamma - h.gamma_iid) < 5 * h.gamma_iid_sd + 0.01  # Γ sees nothing: the features are alike
    assert h.gamma_given_label - h.gamma_given_label_iid > 20 * h.gamma_given_label_iid_sd


def test_no_class_held_by_two_clients_has_no_value_and_off_means_none_measured():
    x, y, _ = _two_class_pool(200)
    apart = [np.flatnonzero(y == 0), np.flatnonzero(y == 1)]  # each class on one client only
    assert all(np.isnan(v) for v in gamma_given_label(x, y, apart, 2))
    zeros = np.flatnonzero(y == 0)
    mixed = [zeros[:50], np.concatenate([zeros[50:], np.flatnonzero(y == 1)])]  # class 1 on one client: left out
    assert gamma_given_label(x, y, mixed, 2, draws=0)[0] == pytest.approx(gamma_reference(x, [zeros[:50], zeros[50:]]))
    h = measure(x, y, [np.arange(0, 200, 2), np.arange(1, 200, 2)], 2, given_label=False)
    assert np.isnan(h.gamma_given_label) and h.as_dict()["gamma_given_label"] is None


def test_hetfed_partition_shows_it_and_it_sees_the_swapped_labels_that_gamma_misses(capsys):
    swaps = ["--set", "partition.kind=iid", "--set", "partition.label_swaps=[null, [1, 7], [3, 8], [4, 9]]"]
    assert main(["partition", "--json", *swaps]) == 0
    out = json.loads(capsys.readouterr().out)
    assert abs(out["gamma_excess"]) < 0.05  # an IID split's level (docs/heterogeneity.md: −0.012); rotations: 5.2
    assert out["gamma_given_label_excess"] > 10 * out["gamma_given_label_iid_sd"]
    assert main(["partition", *swaps]) == 0
    assert "ΔΓ(x|y) = " in capsys.readouterr().out
    assert main(["partition", "--set", "heterogeneity.given_label=false"]) == 0
    assert "Γ(x|y)" not in capsys.readouterr().out
