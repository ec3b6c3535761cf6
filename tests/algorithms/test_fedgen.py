"""FedGen (Zhu et al. 2021) against the paper: the generator's label-weighted ensemble loss, the diversity
term, the clients' head regulariser, label counts as the only extra upload."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hetfed.algorithms import build_algorithm
from hetfed.algorithms.fedgen import FedGenParams as FedGenConfig
from hetfed.algorithms.fedgen import diversity_loss, generator_loss
from hetfed.config import ModelConfig, PartitionConfig, TrainConfig
from hetfed.engine.rng import SERVER_INIT, torch_gen
from hetfed.engine.types import stack_states
from hetfed.errors import ConfigError
from hetfed.executors.inprocess import Pool, SequentialExecutor, VectorisedExecutor, client_data
from hetfed.executors.simulate import simulate
from hetfed.models import build_model
from hetfed.models.base import Model
from hetfed.partition import make_federation
from tests.synthetic import ShiftedGaussians


def _dataset():
    return ShiftedGaussians(n=300, d=5, classes=3)


def _setup(kind="mlp", algorithm="fedgen", **cfg):
    fed = make_federation(_dataset(), PartitionConfig(kind="dirichlet", clients=6, alpha=0.3, min_size=8), 0)
    train = TrainConfig(rounds=3, local_steps=3, batch_size=8, eval_every=3,
                        optimizer={"kind": "sgd", "lr": 0.1, "momentum": 0.0})
    model = build_model(ModelConfig(kind=kind, hidden=[8]), fed.input_shape, fed.n_classes)
    return fed, train, build_algorithm(algorithm, model, train,
                                       FedGenConfig(**{"server_steps": 5, **cfg}) if algorithm == "fedgen" else None)


def test_generator_loss_is_the_label_weighted_ensemble_of_heads():
    """Eq. 4: (1/B) Σ_b Σ_k α_{k,y_b} ℓ(h_k(z_b), y_b), α_{k,y} = n_{k,y} / Σ_j n_{j,y}; heads z·W_k + b_k."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(kind="mlp", hidden=[4]), (5,), 3)
    K, B = 4, 7
    heads = {"layers.1.weight": torch.randn(K, 4, 3), "layers.1.bias": torch.randn(K, 3)}
    z, y = torch.randn(B, 4), torch.tensor([0, 1, 2, 2, 1, 0, 0])
    counts = torch.tensor([[5, 0, 1], [1, 1, 1], [0, 7, 2], [3, 3, 0]], dtype=torch.float64)
    alpha = (counts / counts.sum(0)).float()
    ref = 0.0
    for b in range(B):
        for k in range(K):
            logits = z[b] @ heads["layers.1.weight"][k] + heads["layers.1.bias"][k]
            ref += alpha[k, y[b]] * F.cross_entropy(logits.unsqueeze(0), y[b : b + 1])
    loss = generator_loss(model, heads, z.unsqueeze(0), y.unsqueeze(0), alpha.unsqueeze(0))  # one run
    assert loss.shape == (1,) and float(loss[0]) == pytest.approx(float(ref / B), rel=1e-5)


def test_diversity_term_as_in_the_authors_code():
    eps, z = torch.randn(6, 3), torch.randn(6, 4)
    pair = [[((eps[i] - eps[j]) ** 2).mean() * ((z[i] - z[j]) ** 2).mean() for j in range(6)] for i in range(6)]
    loss = diversity_loss(eps.unsqueeze(0), z.unsqueeze(0))
    assert float(loss[0]) == pytest.approx(float(torch.exp(-torch.tensor(pair).mean())), rel=1e-5)


def test_clients_upload_their_label_counts_and_the_regulariser_moves_only_the_head():
    fed, train, algo = _setup()
    algo.bind(fed, 0, 6)
    server = algo.server_init(torch_gen(0, SERVER_INIT))
    pool = Pool(torch.as_tensor(fed.x), torch.as_tensor(fed.y), fed.train, 0, fed.val)
    ids = [0, 3]
    states = stack_states([algo.client_init(k, torch_gen(0, 3, k)) for k in ids])
    data = client_data(pool, ids, 0)
    upload, _ = algo.local_update(algo.broadcast(server, 0), states, data)
    assert set(upload.extra) == {"train_loss", "label_counts"}
    for j, k in enumerate(ids):
        assert upload.extra["label_counts"][j].tolist() == np.bincount(fed.y[fed.train[k]], minlength=3).tolist()
    assert algo._objective(algo.broadcast(server, 0), data, states) is None  # round 0: no trained generator yet
    trained = algo.aggregate(server, upload)
    bc = algo.broadcast(trained, 1)
    assert bc.extra["alpha"] == pytest.approx(1.0 * 0.98)
    objective = algo._objective(bc, data, states)
    params = {k: v.unsqueeze(0).expand(2, *v.shape).clone().requires_grad_(True) for k, v in bc.params.items()}
    # a batch whose rows are all padding: its cross-entropy is zero, so only the teaching term moves anything
    xb, yb, mask = data.x[:2].unsqueeze(1), data.y[:2].unsqueeze(1), torch.zeros(2, 1)
    total, ce = objective.on(objective.held())[0](params, xb, yb, mask, None)
    assert torch.equal(ce, torch.zeros(2))
    grads = dict(zip(params, torch.autograd.grad(total.sum(), list(params.values()), allow_unused=True),
                     strict=True))
    for name, g in grads.items():
        assert (g is not None and g.abs().sum() > 0) == (name in algo.model.head_names), name


def test_round_zero_is_fedavg_and_the_generator_learns():
    fed, train, algo = _setup(server_steps=60)
    one = TrainConfig(**{**train.model_dump(), "rounds": 1})
    _, _, avg = _setup(algorithm="fedavg")
    a, b = simulate(algo, fed, one, seed=2), simulate(avg, fed, one, seed=2)
    for k in b.server.params:
        assert torch.equal(a.server.params[k], b.server.params[k])
    losses = a.server.extra["generator_loss"]
    assert np.mean(losses[-10:]) < np.mean(losses[:10])


@pytest.mark.parametrize("kind", ["mlp", "cgau"])
def test_executors_agree(kind):
    runs = []
    for executor in (VectorisedExecutor(), SequentialExecutor()):
        fed, train, algo = _setup(kind)
        runs.append(simulate(algo, fed, train, seed=1, executor=executor))
    a, b = runs
    for k in a.server.params:
        torch.testing.assert_close(a.server.params[k], b.server.params[k], rtol=1e-5, atol=1e-6)


def test_a_model_without_a_declared_head_is_refused():
    class Plain(Model):
        n_classes = 3

        def specs(self):
            return []

    with pytest.raises(ConfigError, match="features and a head"):
        build_algorithm("fedgen", Plain(), TrainConfig())


def test_runs_aggregated_together_train_each_generator_as_alone():
    """#74 §1: a stacked sweep's FedGen runs train their generators along a run axis in one call per round
    (``aggregate_runs``); each run's new model, generator, label prior and losses are its own aggregation's, to the
    bit on a CPU — three seeds, each with its own clients' uploads and its own stream of draws."""
    runs = []
    for seed in range(3):
        fed, train, algo = _setup(server_steps=7)
        algo.bind(fed, seed, 6)
        server = algo.server_init(torch_gen(seed, SERVER_INIT))
        pool = Pool(torch.as_tensor(fed.x), torch.as_tensor(fed.y), fed.train, 0, fed.val)
        ids = [0, 2, 5]
        states = stack_states([algo.client_init(k, torch_gen(seed, 3, k)) for k in ids])
        upload, _ = algo.local_update(algo.broadcast(server, 0), states, client_data(pool, ids, seed))
        runs.append((algo, server, upload))
    assert len({a.aggregate_key(s, u) for a, s, u in runs}) == 1
    together = type(runs[0][0]).aggregate_runs(*zip(*runs, strict=True))
    for (algo, server, upload), joined in zip(runs, together, strict=True):
        alone = algo.aggregate(server, upload)
        assert joined.round == alone.round == 1
        for part in ("params", "generator"):
            a = alone.params if part == "params" else alone.extra[part]
            b = joined.params if part == "params" else joined.extra[part]
            assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), part
        assert torch.equal(joined.extra["label_prior"], alone.extra["label_prior"])
        assert joined.extra["generator_loss"] == alone.extra["generator_loss"]
        assert len(alone.extra["generator_loss"]) == 7
    generators = [j.extra["generator"] for j in together]
    assert not all(torch.equal(generators[0][k], generators[1][k]) for k in generators[0])  # the runs differ
