"""Clipped clustering (Li et al., IEEE TBD 2023) against Blades' ``Clippedclustering.__call__`` written out, over
several rounds (its norm history carried in the server's state); what it keeps; its settings' refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.cluster import AgglomerativeClustering

from hetfed.config import ServerConfig, build_config
from hetfed.engine.types import Upload
from hetfed.errors import ConfigError
from hetfed.server.chain import DECIDED
from hetfed.server.pipeline import server_chain


class _Blades:
    """``Clippedclustering`` (agg mean, no SignGuard step) as Blades releases it, on updates ``[n, d]``."""

    def __init__(self, max_tau: float = 1e5, linkage: str = "average") -> None:
        self.tau, self.linkage, self.l2norm_his = max_tau, linkage, []

    def __call__(self, updates: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        updates = updates.clone()
        l2norms = [torch.norm(update).item() for update in updates]
        self.l2norm_his.extend(l2norms)
        threshold = min(np.median(self.l2norm_his), self.tau)
        for idx, l2 in enumerate(l2norms):
            if l2 > threshold:  # torch_utils.clip_tensor_norm_
                updates[idx] = updates[idx] * min(1.0, threshold / (l2 + 1e-6))
        num = len(updates)
        dis_max = np.zeros((num, num))
        for i in range(num):
            for j in range(i + 1, num):
                dis_max[i, j] = 1 - torch.nn.functional.cosine_similarity(updates[i, :], updates[j, :], dim=0)
                dis_max[j, i] = dis_max[i, j]
        dis_max[np.isnan(dis_max)] = 2
        labels = AgglomerativeClustering(metric="precomputed", linkage=self.linkage, n_clusters=2).fit(dis_max).labels_
        flag = 1 if np.sum(labels) > num // 2 else 0
        selected = [idx for idx, label in enumerate(labels) if label == flag]
        return updates[selected].mean(0), selected


def _round(rng: np.random.Generator, honest: int, bad: int, d: int) -> np.ndarray:
    direction = rng.normal(size=d)
    updates = direction + rng.normal(size=(honest, d)) * rng.uniform(0.3, 1.5, size=(honest, 1))
    crafted = -rng.uniform(0.5, 5.0) * direction + 0.05 * rng.normal(size=(bad, d))
    return np.vstack([updates, crafted]) * rng.uniform(0.2, 3.0)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), honest=st.integers(3, 12), bad=st.integers(0, 4), d=st.integers(3, 40),
       rounds=st.integers(1, 4), linkage=st.sampled_from(["average", "single"]),
       max_tau=st.sampled_from([1e5, 1.0]))
def test_clipped_clustering_is_blades_over_rounds(seed, honest, bad, d, rounds, linkage, max_tau):
    rng = np.random.default_rng(seed)
    reference = _Blades(max_tau, linkage)
    chain = server_chain(ServerConfig(combine={"rule": "clipped_clustering", "linkage": linkage, "max_tau": max_tau}))
    state: dict = {}
    cut = max(1, d // 2)
    for rnd in range(rounds):
        old = rng.normal(size=d)
        updates = _round(rng, honest, bad, d)
        n = len(updates)
        upload = Upload(list(range(n)), {"a": torch.as_tensor(old[:cut] + updates[:, :cut]),
                                         "b": torch.as_tensor(old[cut:] + updates[:, cut:])}, torch.ones(n), {})
        new, state = chain.step({"a": torch.as_tensor(old[:cut]), "b": torch.as_tensor(old[cut:])}, upload, state,
                                round=rnd)
        expected, kept = reference(torch.as_tensor(updates))
        assert [i for i in range(n) if state[DECIDED]["weights"][i] > 0] == kept
        np.testing.assert_allclose(torch.cat([new["a"], new["b"]]).numpy() - old, expected.numpy(), rtol=1e-9,
                                   atol=1e-9)
        assert len(state["combine"]["norms"]) == n * (rnd + 1)  # every update's norm so far, in its checkpoints


def test_clipped_clustering_leaves_out_the_updates_pointing_the_other_way():
    rng = np.random.default_rng(4)
    direction = rng.normal(size=30)
    honest = direction + 0.3 * rng.normal(size=(8, 30))
    updates = np.vstack([honest, -3.0 * direction + 0.01 * rng.normal(size=(3, 30))])
    upload = Upload(list(range(11)), {"w": torch.as_tensor(updates)}, torch.ones(11), {})
    chain = server_chain(ServerConfig(combine={"rule": "clipped_clustering"}))
    new, state = chain.step({"w": torch.zeros(30, dtype=torch.float64)}, upload, {}, round=0)
    assert (state[DECIDED]["weights"][8:] == 0).all() and (state[DECIDED]["weights"][:8] > 0).all()


def test_one_update_is_kept_and_bad_settings_are_refused_in_one_line():
    chain = server_chain(ServerConfig(combine={"rule": "clipped_clustering"}))
    upload = Upload([0], {"w": torch.ones(1, 4, dtype=torch.float64)}, torch.ones(1), {})
    new, state = chain.step({"w": torch.zeros(4, dtype=torch.float64)}, upload, {}, round=0)
    assert torch.equal(new["w"], torch.ones(4, dtype=torch.float64)) and float(state[DECIDED]["weights"][0]) == 1.0
    for section, expected in (({"linkage": "ward"}, "server.combine.linkage = 'ward'"),
                              ({"max_tau": 0}, "server.combine.max_tau = 0")):
        with pytest.raises(ConfigError) as err:
            build_config({"server": {"combine": {"rule": "clipped_clustering", **section}}})
        assert expected in str(err.value) and "\n" not in str(err.value)


def test_the_norm_history_is_kept_through_a_checkpoint():
    """The history lives in the server state's chain entry: a run saved after 2 of 4 rounds (pickled, as a checkpoint
    is) and resumed ends where the uninterrupted run does, and its history holds every update's norm."""
    import pickle

    from hetfed.executors.inprocess import VectorisedExecutor
    from hetfed.executors.simulate import simulate
    from tests.server.test_robust import _algo, _fed

    fed = _fed()
    combine = {"rule": "clipped_clustering"}
    algo, cfg = _algo(fed, combine=combine, rounds=4)
    whole = simulate(algo, fed, cfg, seed=1, executor=VectorisedExecutor())
    algo, cfg = _algo(fed, combine=combine, rounds=2)
    half = simulate(algo, fed, cfg, seed=1, executor=VectorisedExecutor())
    kept = len(half.server.extra["server_chain"]["combine"]["norms"])
    states, half.executor = half.executor.states.state_dict(), None
    algo, cfg = _algo(fed, combine=combine, rounds=4)
    resumed = simulate(algo, fed, cfg, seed=1, executor=VectorisedExecutor(), resume=pickle.loads(pickle.dumps(half)),
                       resume_states=states)
    assert len(resumed.server.extra["server_chain"]["combine"]["norms"]) == 2 * kept > 0
    for k in whole.server.params:
        assert torch.equal(whole.server.params[k], resumed.server.params[k]), k
