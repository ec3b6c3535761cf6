"""``feature_clusters``' k-means is scikit-learn's ``KMeans(...).fit`` to the bit: the clients a seed gives must not
move because hetfed stopped paying for scikit-learn's per-call checks."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.cluster import KMeans
from sklearn.exceptions import ConvergenceWarning
from threadpoolctl import threadpool_limits

from hetfed.config import DatasetConfig
from hetfed.data import load_dataset
from hetfed.partition import classes_present, pca_view
from hetfed.partition._kmeans import kmeans


def _sklearn(x: np.ndarray, k: int, seed: int) -> KMeans:
    with threadpool_limits(limits=1, user_api="openmp"):  # what feature_clusters asked of it: one thread
        return KMeans(n_clusters=k, n_init=4, random_state=seed).fit(x)


def _same(x: np.ndarray, k: int, seed: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        expected = _sklearn(x, k, seed)
        labels, centres = kmeans(x, k, 4, seed)
    assert np.array_equal(labels, expected.labels_)
    assert centres.dtype == expected.cluster_centers_.dtype
    assert np.array_equal(centres, expected.cluster_centers_)  # to the bit, not to a tolerance


@settings(max_examples=40, deadline=None)
@given(n=st.sampled_from([12, 60, 181, 1300, 2500]), d=st.integers(1, 6), k=st.integers(2, 11),
       float32=st.booleans(), duplicated=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_kmeans_gives_sklearns_labels_and_centres_to_the_bit(n, d, k, float32, duplicated, seed):
    """Both float widths (float32 is upcast in chunks: 1 300 and 2 500 rows take two and three), ties from
    duplicated rows, any seed."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d)) * rng.uniform(0.1, 10, size=d) + rng.normal(size=d) * 5
    if duplicated:
        x[: n // 3] = x[0]
    _same(x.astype(np.float32 if float32 else np.float64), min(k, n - 1), seed)


@pytest.mark.parametrize("components", [2, 3])
def test_every_class_of_the_bundled_data_clusters_as_with_sklearn(components):
    data = load_dataset(DatasetConfig(name="digits"))
    z = pca_view(data.x_train, components, seed=7)
    for c in classes_present(data.y_train):
        _same(z[data.y_train == c], 10, 1000 + int(c))


def test_fewer_distinct_clusters_than_asked_warns_as_sklearn_does():
    x = np.repeat(np.arange(3.0)[:, None], 5, axis=0)
    with pytest.warns(ConvergenceWarning, match=r"Number of distinct clusters \(3\) found smaller than n_clusters"):
        labels, _ = kmeans(x, 4, 4, 0)
    assert len(set(labels)) == 3
