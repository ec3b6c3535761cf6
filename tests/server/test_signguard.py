"""SignGuard (Xu et al., ICDCS 2022) against its authors' code (JianXu95/SignGuard, ``signguard_multiclass.aggregate``)
written out step by step, with the same window drawn from the same generator; what it keeps and leaves out; its
refusals and the cases the authors' code has no answer for."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from sklearn.cluster import MeanShift, estimate_bandwidth

from hetfed.config import ServerConfig, build_config
from hetfed.engine.rng import COMBINE_NOISE, torch_gen
from hetfed.engine.types import Upload
from hetfed.errors import ConfigError
from hetfed.server.combine.signguard import largest_cluster, norm_filter, sign_features
from hetfed.server.pipeline import server_chain


def _authors(grads: torch.Tensor, gen: torch.Generator) -> tuple[torch.Tensor, list[int]] | None:
    """``signguard_multiclass.aggregate`` as released (one iteration, MeanShift), on updates ``[n, d]``: the window's
    start drawn from ``gen`` where the authors' code draws it from torch's global generator. None where the released
    code has no answer: a bandwidth estimate of 0 (MeanShift refuses it), or no update kept by both filters (a mean
    of nothing)."""
    num_users = len(grads)
    all_set = set(range(num_users))
    grad_l2norm = torch.norm(grads, dim=1).cpu().numpy()
    norm_med = np.median(grad_l2norm)
    benign_idx1 = all_set.intersection({int(i) for i in np.argwhere(grad_l2norm > 0.1 * norm_med).ravel()})
    benign_idx1 = benign_idx1.intersection({int(i) for i in np.argwhere(grad_l2norm < 3.0 * norm_med).ravel()})
    num_param = grads.shape[1]
    num_spars = int(0.1 * num_param)
    idx = torch.randint(0, (num_param - num_spars), size=(1,), generator=gen).item()
    sign_grads = torch.sign(grads[:, idx:(idx + num_spars)])
    feats = []
    for s in (1.0, 0.0, -1.0):
        share = sign_grads.eq(s).sum(dim=1, dtype=torch.float32) / num_spars
        feats.append(share / (share.max() + 1e-8))
    sign_feat = torch.stack(feats, dim=1).cpu().numpy()
    bandwidth = estimate_bandwidth(sign_feat, quantile=0.5, n_samples=50)
    if bandwidth == 0:
        return None
    ms = MeanShift(bandwidth=bandwidth, bin_seeding=True, cluster_all=False).fit(sign_feat)
    labels = ms.labels_
    labels_unique = np.unique(labels)
    n_cluster = len(labels_unique) - (1 if -1 in labels_unique else 0)
    benign_class = np.argmax([np.sum(labels == i) for i in range(n_cluster)])
    benign_idx2 = all_set.intersection({int(i) for i in np.argwhere(labels == benign_class).ravel()})
    benign_idx = sorted(benign_idx2.intersection(benign_idx1))
    if not benign_idx:
        return None
    grad_norm = torch.norm(grads, dim=1).reshape((-1, 1))
    norm_clip = grad_norm.median(dim=0)[0].item()
    grads_clip = (grads / grad_norm) * torch.clamp(grad_norm, 0, norm_clip)
    return grads_clip[benign_idx].mean(dim=0), benign_idx


def _round(seed: int, honest: int, bad: int, d: int, kind: str) -> tuple[np.ndarray, np.ndarray]:
    """A reference model and honest updates scattered around a common direction, plus ``bad`` crafted ones."""
    rng = np.random.default_rng(seed)
    ref = rng.normal(size=d)
    direction = rng.normal(size=d)
    updates = direction + rng.normal(size=(honest, d)) * rng.uniform(0.5, 2.0, size=(honest, 1))
    if kind == "flip":
        crafted = -4.0 * updates.mean(0) + 0.01 * rng.normal(size=(bad, d))
    elif kind == "huge":
        crafted = 50.0 * updates[:bad]
    else:  # every coordinate pushed one way, at an honest norm
        crafted = np.abs(updates[:bad]) * rng.choice([-1.0, 1.0])
    return ref, np.vstack([updates, crafted]) if bad else updates


def _combine(ref: np.ndarray, updates: np.ndarray, seed: int, rnd: int, **params) -> tuple[np.ndarray, list[int]]:
    n, d = updates.shape
    cut = max(1, d // 3)
    models = ref + updates
    upload = Upload(list(range(100, 100 + n)), {"a": torch.as_tensor(models[:, :cut]),
                                                "b": torch.as_tensor(models[:, cut:])}, torch.ones(n), {})
    chain = server_chain(ServerConfig(combine={"rule": "signguard", **params}))
    new, state = chain.step({"a": torch.as_tensor(ref[:cut]), "b": torch.as_tensor(ref[cut:])}, upload, {},
                            round=rnd, seed=seed)
    weights = state["decided"]["weights"]
    return torch.cat([new["a"], new["b"]]).numpy(), [i for i in range(n) if weights[i] > 0]


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), honest=st.integers(4, 14), bad=st.integers(0, 4), d=st.integers(60, 300),
       kind=st.sampled_from(["flip", "huge", "signs"]), rnd=st.integers(0, 40))
def test_signguard_is_its_authors_code(seed, honest, bad, d, kind, rnd):
    ref, updates = _round(seed, honest, bad, d, kind)
    answer = _authors(torch.as_tensor(updates), torch_gen(seed, COMBINE_NOISE, rnd))
    assume(answer is not None)  # what this one does where the authors' code has no answer: the tests below
    assert answer is not None
    expected, kept = answer
    value, chosen = _combine(ref, updates, seed, rnd)
    assert chosen == kept
    np.testing.assert_allclose(value, ref + expected.numpy(), rtol=1e-10, atol=1e-10)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10_000), honest=st.integers(6, 14), bad=st.integers(1, 2), d=st.integers(200, 600),
       kind=st.sampled_from(["huge", "signs"]))
def test_signguard_leaves_out_updates_too_large_or_pushed_one_way_in_every_coordinate(seed, honest, bad, d, kind):
    """What each filter is for: a norm far above the median's (the norm filter), every coordinate's sign the same at
    an honest norm (the sign filter) — where the honest updates are alike (one direction, small noise) and the crafted
    ones few. Many alike colluders can be MeanShift's largest cluster instead (results/robust_digits_colluding: Fang's
    Trim attack). A sign flip of the honest mean is not caught either: where honest updates have as many positive as
    negative coordinates, its sign shares are theirs. At least 200 coordinates, so the window (10 %) holds 20: with 6
    (d = 60) the honest direction was one-way in the window often enough (2⁻⁶ an example) to fail a CI run (seed 296,
    6 honest, 1 crafted, d = 60)."""
    rng = np.random.default_rng(seed)
    ref, direction = rng.normal(size=d), rng.normal(size=d)
    updates = direction + 0.2 * rng.normal(size=(honest, d))
    crafted = 50.0 * updates[:bad] if kind == "huge" else np.abs(updates[:bad]) * rng.choice([-1.0, 1.0])
    _, chosen = _combine(ref, np.vstack([updates, crafted]), seed, 3)
    assert not set(chosen) & set(range(honest, honest + bad)) and chosen


def test_signguard_keeps_every_update_when_their_signs_are_alike_and_averages_them_clipped():
    updates = np.tile(np.linspace(1.0, 2.0, 30), (5, 1)) * np.array([[1.0], [1.0], [2.0], [0.5], [1.5]])
    ref = np.zeros(30)
    value, chosen = _combine(ref, updates, 7, 2)  # every sign share equal: the bandwidth estimate is 0
    assert chosen == [0, 1, 2, 3, 4]
    norms = np.linalg.norm(updates, axis=1)
    clipped = updates * np.minimum(1.0, np.median(norms) / norms)[:, None]
    np.testing.assert_allclose(value, clipped.mean(0), rtol=1e-12)


def test_signguard_averages_the_norm_filters_updates_when_the_filters_share_none():
    def signs(positive: float, zero: float) -> np.ndarray:
        p, z = int(40 * positive), int(40 * zero)
        return np.r_[np.ones(p), np.zeros(z), -np.ones(40 - p - z)]

    # four alike in sign (the sign filter's cluster), all far above 3× the median norm (the norm filter's leavings)
    updates = np.array([np.full(40, 100.0)] * 4 + [signs(0, 0), signs(0.5, 0.5), signs(0, 0.5), signs(0.25, 0.25),
                                                  signs(0.5, 0)])
    features = sign_features(torch.as_tensor(updates))
    norms = np.linalg.norm(updates, axis=1)
    assert not (largest_cluster(features) & norm_filter(norms, 0.1, 3.0)).any()
    value, chosen = _combine(np.zeros(40), updates, 2, 0, coordinates=1.0)
    assert chosen == [4, 5, 6, 7, 8]
    bound = np.sort(norms)[(len(norms) - 1) // 2]  # torch's median: the lower middle
    np.testing.assert_allclose(value, (updates[4:] * np.minimum(1.0, bound / norms[4:])[:, None]).mean(0), rtol=1e-12)


@pytest.mark.parametrize(("section", "expected"), [
    ({"lower": 3.0, "upper": 2.0}, "lower = 3 must be below upper = 2"),
    ({"coordinates": 0}, "server.combine.coordinates = 0: Input should be greater than 0"),
    ({"bucket": 2, "lower": 0.2}, None),
])
def test_signguards_settings_are_validated_in_one_line(section, expected):
    if expected is None:
        assert build_config({"server": {"combine": {"rule": "signguard", **section}}})
        return
    with pytest.raises(ConfigError) as err:
        build_config({"server": {"combine": {"rule": "signguard", **section}}})
    assert expected in str(err.value) and "\n" not in str(err.value)
