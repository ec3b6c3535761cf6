"""q-FedAvg (Li et al. 2020, Algorithm 2) against Flower 1.42's own ``QFedAvg`` strategy class, driven with the
replies of hetfed's clients, and its clients' F_k(w) against the mean cross-entropy computed here in NumPy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetfed.algorithms import build_algorithm
from hetfed.config import ModelConfig, OptimizerConfig, PartitionConfig, TrainConfig
from hetfed.engine.rng import CLIENT_INIT, SERVER_INIT, torch_gen
from hetfed.engine.types import stack_states
from hetfed.executors.inprocess import Pool, client_data
from hetfed.models import build_model
from hetfed.partition import make_federation
from tests.flower_strategy import Nodes, flower_task  # noqa: F401  (the fixture, by name)
from tests.synthetic import ShiftedGaussians

LR = 0.3


def _round(name: str, params: dict, clients: list[int]):
    """One round of ``name`` on Dirichlet clients of unequal sizes: the algorithm, its server state and the
    clients' upload."""
    fed = make_federation(ShiftedGaussians(n=240, d=5, classes=3), PartitionConfig(
        kind="dirichlet", clients=5, alpha=0.5, min_size=10), 0)
    model = build_model(ModelConfig(kind="logreg"), fed.input_shape, fed.n_classes)
    train = TrainConfig(local_steps=4, batch_size=16, optimizer=OptimizerConfig(lr=LR, momentum=0.0))
    algo = build_algorithm(name, model, train, params)
    algo.bind(fed)
    server = algo.server_init(torch_gen(0, SERVER_INIT))
    pool = Pool(torch.as_tensor(fed.x), torch.as_tensor(fed.y), fed.train, 0, fed.val)
    states = stack_states([algo.client_init(k, torch_gen(0, CLIENT_INIT, k)) for k in clients])
    upload, _ = algo.local_update(algo.broadcast(server, 0), states, client_data(pool, clients, 0))
    return fed, algo, server, upload


def _flowers_step(server, upload, q: float, copies: list[int], monkeypatch) -> dict[str, np.ndarray]:
    """The global model after Flower's QFedAvg.aggregate_train, each client's reply (its model, its F_k as
    ``train_loss``) sent ``copies[k]`` times."""
    import flwr.app.message.arrayrecord as arrayrecord
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
    from flwr.serverapp.strategy import QFedAvg

    # Flower frees each reply's arrays with a full gc.collect() as it reads them (0.2 s each beside torch's heap):
    # memory housekeeping that changes no number, skipped here for the ~200 replies
    monkeypatch.setattr(arrayrecord.gc, "collect", lambda *a: 0)

    names = sorted(server.params)
    n = sum(copies)
    strategy = QFedAvg(client_learning_rate=LR, q=q, min_available_nodes=n, min_train_nodes=n)
    arrays = ArrayRecord({k: Array(server.params[k].numpy().copy()) for k in names})
    instructions = list(strategy.configure_train(1, arrays, ConfigRecord(), Nodes(n)))
    rows = [i for i, c in enumerate(copies) for _ in range(c)]
    replies = [Message(RecordDict({
        "arrays": ArrayRecord({k: Array(upload.params[k][i].numpy().copy()) for k in names}),
        "metrics": MetricRecord({"num-examples": 1, "train_loss": float(upload.extra["start_loss"][i])})}),
        reply_to=msg) for i, msg in zip(rows, instructions, strict=True)]
    new, _ = strategy.aggregate_train(1, replies)
    return {k: new[k].numpy() for k in names}


@pytest.mark.parametrize("q", [0.5, 2.0])
@pytest.mark.parametrize("weighting", ["uniform", "samples"])
def test_the_server_step_is_flowers_qfedavg_given_the_same_replies(flower_task, monkeypatch, q,  # noqa: F811
                                                                   weighting):
    """``uniform``: each client's reply once, as Flower's class sums them; ``samples``: client k's reply n_k times —
    Σ n_k Δ_k / Σ n_k h_k, the weighted sums hetfed takes by default."""
    clients = [0, 1, 2, 3, 4]
    fed, algo, server, upload = _round("qfedavg", {"q": q, "weighting": weighting}, clients)
    sizes = [len(fed.train[k]) for k in clients]
    assert len(set(sizes)) > 1  # unequal clients: the weighting matters
    want = _flowers_step(server, upload, q, sizes if weighting == "samples" else [1] * len(clients),
                         monkeypatch)
    got = algo.aggregate(server, upload).params
    moved = 0.0
    for k, value in want.items():
        np.testing.assert_allclose(got[k].numpy(), value, rtol=1e-5, atol=1e-6)
        moved = max(moved, float(np.abs(value - server.params[k].numpy()).max()))
    assert moved > 1e-3  # the step is not nothing


def test_each_client_reports_its_mean_training_loss_under_the_model_it_received():
    clients = [1, 3]
    fed, _algo, server, upload = _round("qfedavg", {}, clients)
    names = sorted(server.params)
    w = server.params[[n for n in names if n.endswith("weight")][0]].double().numpy()
    b = server.params[[n for n in names if n.endswith("bias")][0]].double().numpy()
    for row, k in enumerate(clients):
        x, y = fed.x[fed.train[k]].astype(np.float64), fed.y[fed.train[k]]
        z = x @ w + b
        log_p = z - z.max(1, keepdims=True) - np.log(np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True))
        assert float(upload.extra["start_loss"][row]) == pytest.approx(-log_p[np.arange(len(y)), y].mean(), rel=1e-5)


def test_with_q_zero_and_weights_by_samples_the_step_is_fedavgs():
    clients = [0, 2, 4]
    _fed, algo, server, upload = _round("qfedavg", {"q": 0.0}, clients)
    _fed, fedavg, server_avg, upload_avg = _round("fedavg", None, clients)
    for k, v in fedavg.aggregate(server_avg, upload_avg).params.items():
        torch.testing.assert_close(algo.aggregate(server, upload).params[k], v, rtol=1e-6, atol=1e-7)
