"""AFL (Goetz et al. 2019) against the paper: the loss valuation, the sampling rule, the server's memory."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hetfed.algorithms import build_algorithm
from hetfed.algorithms.afl import VALUATIONS, afl_sample
from hetfed.algorithms.afl import AFLParams as AFLConfig
from hetfed.config import ModelConfig, PartitionConfig, TrainConfig
from hetfed.engine.rng import SERVER_INIT, torch_gen
from hetfed.engine.types import stack_states
from hetfed.executors.inprocess import Pool, SequentialExecutor, VectorisedExecutor, client_data
from hetfed.executors.simulate import RoundObserver, simulate
from hetfed.models import build_model
from hetfed.partition import make_federation
from tests.synthetic import ShiftedGaussians


def _dataset():
    return ShiftedGaussians(n=300, d=4, classes=3)


def _setup(kind="logreg", fraction=0.4, **afl):
    fed = make_federation(_dataset(), PartitionConfig(kind="dirichlet", clients=10, alpha=0.5, min_size=8), 0)
    train = TrainConfig(rounds=6, client_fraction=fraction, local_steps=3, batch_size=8, eval_every=3,
                        optimizer={"kind": "sgd", "lr": 0.1, "momentum": 0.0})
    model = build_model(ModelConfig(kind=kind, **({"hidden": [8]} if kind == "mlp" else {})), fed.input_shape,
                        fed.n_classes)
    return fed, train, build_algorithm("afl", model, train, AFLConfig(**afl))


def test_the_valuation_is_the_received_models_loss_over_root_n():
    """v_k = (1/√n_k) Σ_i ℓ(x_i, y_i) under the model the client receives, before it trains."""
    fed, train, algo = _setup()
    algo.bind(fed, 0, 4)
    server = algo.server_init(torch_gen(0, SERVER_INIT))
    W, b = server.params["layers.0.weight"].double(), server.params["layers.0.bias"].double()
    X, Y = torch.as_tensor(fed.x).double(), torch.as_tensor(fed.y)
    ids = [1, 4, 7]
    pool = Pool(torch.as_tensor(fed.x), torch.as_tensor(fed.y), fed.train, 0, fed.val)
    states = stack_states([algo.client_init(k, torch_gen(0, 3, k)) for k in ids])
    upload, _ = algo.local_update(algo.broadcast(server, 0), states, client_data(pool, ids, 0))
    for j, k in enumerate(ids):
        idx = torch.as_tensor(fed.train[k])
        expected = F.cross_entropy(X[idx] @ W + b, Y[idx], reduction="sum") / math.sqrt(len(idx))
        assert float(upload.extra["valuation"][j]) == pytest.approx(float(expected), rel=1e-5)
    assert set(upload.extra) == {"train_loss", "valuation"}
    new = algo.aggregate(server, upload)
    v = new.extra[VALUATIONS]
    assert torch.equal(v[ids], upload.extra["valuation"].double())
    assert torch.isnan(v[[0, 2, 3, 5, 6, 8, 9]]).all()  # not sampled: nothing new (never valued yet)


def test_sampling_follows_the_papers_rule():
    values = np.array([0.0, 1.0, 2.0, 3.0, 10.0, 11.0, 12.0, 13.0])
    eligible = np.arange(8)
    # α1 = 0.5: the four lowest never come from the softmax; α3 = 0: nothing uniform; m = 1: one softmax draw
    cfg = AFLConfig(alpha1=0.5, alpha2=0.5, alpha3=0.0)
    counts = np.zeros(8)
    rng = np.random.default_rng(0)
    for _ in range(20_000):
        counts[afl_sample(values, eligible, 1, cfg, rng)] += 1
    assert counts[:4].sum() == 0
    p = np.exp(0.5 * values[4:]) / np.exp(0.5 * values[4:]).sum()
    np.testing.assert_allclose(counts[4:] / counts.sum(), p, atol=0.015)
    # α3 = 1: every client uniformly, valuations ignored
    counts = np.zeros(8)
    for _ in range(20_000):
        counts[afl_sample(values, eligible, 2, AFLConfig(alpha1=0.5, alpha3=1.0), rng)] += 1
    np.testing.assert_allclose(counts / counts.sum(), np.full(8, 1 / 8), atol=0.015)
    # the mix: ⌈(1 − α3)·m⌉ from the softmax part, the rest from anyone not yet chosen; no repeats
    for _ in range(200):
        chosen = afl_sample(values, eligible, 4, AFLConfig(alpha1=0.75, alpha3=0.5), rng)
        assert len(set(chosen)) == 4 and len(set(chosen) & {6, 7}) == 2  # the top 2 are the only softmax candidates


def test_clients_never_valued_are_tried_first_and_then_the_high_loss_ones_more_often():
    values = np.array([np.nan, np.nan, 0.1, 0.2, 5.0, 6.0])
    rng = np.random.default_rng(1)
    cfg = AFLConfig(alpha1=0.5, alpha2=5.0, alpha3=0.0)
    hits = np.zeros(6)
    for _ in range(2000):
        hits[afl_sample(values, np.arange(6), 2, cfg, rng)] += 1
    assert hits[2] == hits[3] == 0 and hits[0] > 0 and hits[1] > 0  # unknown = the highest known valuation


class _Sampled(RoundObserver):
    """How many clients each round sampled (a round observer)."""

    def __init__(self) -> None:
        self.sampled: list[int] = []

    def trained(self, rnd: int, metrics: dict[str, float]) -> None:
        self.sampled.append(int(metrics["clients_sampled"]))


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
def test_executors_agree_and_the_algorithm_chooses_the_clients(kind):
    runs = []
    for executor in (VectorisedExecutor(), SequentialExecutor()):
        fed, train, algo = _setup(kind)
        watch = _Sampled()
        runs.append((simulate(algo, fed, train, seed=3, executor=executor, observers=[watch]), watch.sampled))
    (a, _), (b, counts) = runs
    for k in a.server.params:
        torch.testing.assert_close(a.server.params[k], b.server.params[k], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(a.server.extra[VALUATIONS], b.server.extra[VALUATIONS], rtol=1e-5, atol=1e-8,
                               equal_nan=True)
    assert counts == [4] * 6
    assert int(torch.isfinite(a.server.extra[VALUATIONS]).sum()) >= 8  # optimistic start: most clients tried
