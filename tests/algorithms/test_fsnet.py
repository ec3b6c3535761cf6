import math

import numpy as np
import pytest
import torch

from hetfed.algorithms import build_algorithm
from hetfed.algorithms.fsnet import FSNetParams as FSNetConfig
from hetfed.algorithms.fsnet import beta_schedule, kl_uniform, near_one_hot, sample_mixture, train_hidden
from hetfed.config import ModelConfig, OptimizerConfig, PartitionConfig, TrainConfig
from hetfed.engine.types import Upload
from hetfed.executors.inprocess import SequentialExecutor, VectorisedExecutor
from hetfed.executors.simulate import simulate
from hetfed.models import build_model
from hetfed.partition import make_federation


def test_mixture_sampler_moments_match_the_uploads():
    gen = torch.Generator().manual_seed(0)
    means = torch.tensor([[0.0, 10.0], [4.0, -2.0], [1.0, 1.0]])
    variances = torch.tensor([[1.0, 0.25], [4.0, 1.0], [0.01, 9.0]])
    weights = torch.tensor([100.0, 300.0, 600.0])
    z = sample_mixture(means, variances, weights, 400_000, gen)
    pi = (weights / weights.sum()).unsqueeze(1)
    mean = (pi * means).sum(0)
    var = (pi * (variances + means**2)).sum(0) - mean**2
    torch.testing.assert_close(z.mean(0), mean, atol=0.03, rtol=0.01)
    torch.testing.assert_close(z.var(0), var, atol=0.05, rtol=0.02)


def test_near_one_hot_covers_classes_evenly():
    probs, labels = near_one_hot(60, 10, 0.01, torch.Generator().manual_seed(0))
    assert probs.shape == (60, 10)
    torch.testing.assert_close(probs.sum(1), torch.ones(60))
    assert torch.equal(probs.argmax(1), labels)
    assert torch.bincount(labels).tolist() == [6] * 10
    assert (probs.max(1).values > 0.9).all()


def test_kl_to_uniform():
    assert torch.allclose(kl_uniform(torch.zeros(2, 5, 4)), torch.zeros(2), atol=1e-6)
    confident = torch.tensor([[[5.0, 0, 0, 0]]])
    p = torch.softmax(confident[0, 0], -1)
    expected = sum(0.25 * math.log(0.25 / float(q)) for q in p)
    assert kl_uniform(confident).item() == pytest.approx(expected, rel=1e-5)
    assert kl_uniform(confident).item() > 0


def test_beta_schedule():
    cfg = FSNetConfig()
    assert [beta_schedule(cfg, r) for r in (0, 9, 10, 19, 20, 35)] == pytest.approx([1, 1, 0.1, 0.1, 0.01, 0.001])


class _Data:
    def __init__(self):
        rng = np.random.default_rng(0)
        self.y_train = np.repeat(np.arange(4), 100)
        self.x_train = (rng.normal(size=(400, 6)) + 2 * self.y_train[:, None]).astype(np.float32)
        self.y_test = np.repeat(np.arange(4), 20)
        self.x_test = (rng.normal(size=(80, 6)) + 2 * self.y_test[:, None]).astype(np.float32)
        self.n_classes = 4
        self.input_shape = (6,)


def _algo(train, cfg=None):
    fed = make_federation(_Data(), PartitionConfig(kind="shards", clients=4, shards_per_client=1), 0)
    model = build_model(ModelConfig(hidden=[16], dropout=0.2), fed.input_shape, fed.n_classes)
    return fed, build_algorithm("fsnet", model, train,
                                cfg or FSNetConfig(server_steps=60, server_batch=64, n_synthetic=12),
                                in_features=6)


def test_uploads_carry_input_moments_and_the_server_synthesises():
    train = TrainConfig(rounds=3, local_steps=3, optimizer=OptimizerConfig(lr=0.05))
    fed, algo = _algo(train)
    seen = []
    real = algo.local_update

    def spy(bc, states, data):
        up, st = real(bc, states, data)
        seen.append((bc, up, data))
        return up, st

    algo.local_update = spy
    result = simulate(algo, fed, train, 0, executor=VectorisedExecutor())
    bc, up, data = seen[0]
    assert "synthetic" not in bc.extra  # round 0: plain FedAvg
    for i, k in enumerate(up.client_ids):
        xk = torch.as_tensor(fed.x[fed.train[k]])
        torch.testing.assert_close(up.extra["input_mean"][i], xk.mean(0))
        torch.testing.assert_close(up.extra["input_var"][i], xk.var(0, unbiased=False))
    later = seen[-1][0]
    assert later.extra["synthetic"].shape == (12, 6) and later.extra["beta"] == 1.0
    assert result.server.extra["synthetic"].shape == (12, 6)


def test_hidden_model_reconstruction_loss_falls():
    train = TrainConfig(rounds=1, local_steps=2)
    fed, algo = _algo(train, FSNetConfig(server_steps=200, server_batch=128))
    server = algo.server_init(torch.Generator().manual_seed(0))
    up = Upload([0, 1], {k: v.unsqueeze(0).repeat(2, *[1] * v.ndim) for k, v in server.params.items()},
                torch.tensor([100.0, 100.0]),
                {"input_mean": torch.tensor([[0.0] * 6, [6.0] * 6]), "input_var": torch.ones(2, 6)})
    [(_, losses)] = train_hidden([algo], [server.params], [server.extra["hidden"]], [up],
                                 [torch.Generator().manual_seed(1)])
    assert np.mean(losses[-20:]) < 0.5 * np.mean(losses[:20])


def test_kl_term_changes_training_and_executors_agree():
    train = TrainConfig(rounds=3, local_epochs=1, batch_size=16, optimizer=OptimizerConfig(lr=0.05, momentum=0.5))
    fed, algo = _algo(train)
    seq = simulate(algo, fed, train, 0, executor=SequentialExecutor())
    vec = simulate(algo, fed, train, 0, executor=VectorisedExecutor())
    for k in seq.server.params:
        torch.testing.assert_close(seq.server.params[k], vec.server.params[k], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(seq.server.extra["synthetic"], vec.server.extra["synthetic"], rtol=1e-4, atol=1e-5)
    fedavg = simulate(build_algorithm("fedavg", algo.model, train), fed, train, 0, executor=VectorisedExecutor())
    assert not torch.allclose(fedavg.server.params["layers.0.weight"], vec.server.params["layers.0.weight"])


def test_runs_aggregated_together_fit_each_hidden_model_as_alone():
    """#74 §1: a stacked sweep's Fed-FSNet runs fit their hidden models along a run axis in one call per round
    (``aggregate_runs``); each run's model, H_ω, D′ and losses are its own aggregation's, to the bit on a CPU — three
    runs, each with its own uploads (mixtures) and its own seed's draws."""
    train = TrainConfig(rounds=1, local_steps=2)
    runs = []
    for seed in range(3):
        fed, algo = _algo(train, FSNetConfig(server_steps=13, server_batch=32, n_synthetic=12))
        server = algo.server_init(torch.Generator().manual_seed(seed))
        gen = torch.Generator().manual_seed(10 + seed)
        up = Upload([0, 1, 2], {k: v.unsqueeze(0).repeat(3, *[1] * v.ndim) + torch.randn((3, *v.shape), generator=gen)
                                for k, v in server.params.items()},
                    torch.tensor([100.0, 30.0 + seed, 60.0]),
                    {"input_mean": torch.randn(3, 6, generator=gen), "input_var": torch.rand(3, 6, generator=gen)})
        runs.append((algo, server, up))
    assert len({a.aggregate_key(s, u) for a, s, u in runs}) == 1
    together = type(runs[0][0]).aggregate_runs(*zip(*runs, strict=True))
    for (algo, server, up), joined in zip(runs, together, strict=True):
        alone = algo.aggregate(server, up)
        for a, b in ((alone.params, joined.params), (alone.extra["hidden"], joined.extra["hidden"])):
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        assert torch.equal(joined.extra["synthetic"], alone.extra["synthetic"])
        assert joined.extra["hidden_loss"] == alone.extra["hidden_loss"] and len(alone.extra["hidden_loss"]) == 13
    assert not torch.equal(together[0].extra["synthetic"], together[1].extra["synthetic"])  # the runs differ
