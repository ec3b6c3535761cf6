"""FedDyn and FedNova (#24's worked examples of adding an algorithm) against their papers' equations,
written here in NumPy from the papers, not from hetfed's code.

FedDyn (Acar et al. 2021, Algorithm 1): a client minimises L_k(θ) − ⟨g_k, θ⟩ + α/2‖θ − θ^{t−1}‖², then
g_k ← g_k − α(θ_k − θ^{t−1}); the server keeps h ← h − α(1/m)Σ_{k∈P}(θ_k − θ^{t−1}) and sets
θ^t = mean_k θ_k − h/α.
FedNova (Wang et al. 2020, eqs. 5–7, plain SGD so ‖a_i‖₁ = τ_i): x ← x − τ_eff Σ p_i (x − y_i)/τ_i with
τ_eff = Σ p_i τ_i and p_i ∝ n_i.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetfed.algorithms import build_algorithm
from hetfed.algorithms.feddyn import GRAD
from hetfed.config import ModelConfig, OptimizerConfig, PartitionConfig, TrainConfig
from hetfed.engine.rng import CLIENT_INIT, SERVER_INIT, torch_gen
from hetfed.engine.types import Upload, stack_states
from hetfed.executors.inprocess import Pool, client_data
from hetfed.models import build_model
from hetfed.partition import make_federation
from tests.synthetic import ShiftedGaussians


def _fed(clients=4, alpha=0.5):
    return make_federation(ShiftedGaussians(n=200, d=5, classes=3), PartitionConfig(
        kind="dirichlet", clients=clients, alpha=alpha, min_size=10), 0)


def _setup(name, fed, train, params=None):
    model = build_model(ModelConfig(kind="logreg"), fed.input_shape, fed.n_classes)
    algo = build_algorithm(name, model, train, params)
    algo.bind(fed)
    pool = Pool(torch.as_tensor(fed.x), torch.as_tensor(fed.y), fed.train, 0, fed.val)
    return algo, algo.server_init(torch_gen(0, SERVER_INIT)), pool


def _ce_grad(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray):
    """Gradient of the mean cross-entropy of softmax(x W + b) (by hand; hetfed's linear layers store W as
    [in, out])."""
    z = x @ w + b
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    p[np.arange(len(y)), y] -= 1
    return x.T @ p / len(y), p.mean(0)


def test_feddyn_client_step_is_the_papers_dynamic_regulariser():
    fed = _fed()
    alpha, lr = 0.3, 0.5
    train = TrainConfig(local_steps=3, batch_size=10_000, optimizer=OptimizerConfig(lr=lr, momentum=0.0))
    algo, server, pool = _setup("feddyn", fed, train, {"alpha": alpha})
    k = 1
    state = algo.client_init(k, torch_gen(0, CLIENT_INIT, k))
    rng = np.random.default_rng(5)
    g = {name: torch.tensor(rng.normal(size=tuple(v.shape)), dtype=torch.float32)
         for name, v in server.params.items()}
    state.update({GRAD + name: v for name, v in g.items()})
    upload, new = algo.local_update(algo.broadcast(server, 0), stack_states([state]), client_data(pool, [k], 0))

    names = sorted(server.params)  # layers.0.bias, layers.0.weight
    wname, bname = [n for n in names if n.endswith("weight")][0], [n for n in names if n.endswith("bias")][0]
    w0, b0 = server.params[wname].double().numpy(), server.params[bname].double().numpy()
    gw, gb = g[wname].double().numpy(), g[bname].double().numpy()
    x, y = fed.x[fed.train[k]].astype(np.float64), fed.y[fed.train[k]]
    w, b = w0.copy(), b0.copy()
    for _ in range(3):
        dw, db = _ce_grad(w, b, x, y)
        w, b = w - lr * (dw - gw + alpha * (w - w0)), b - lr * (db - gb + alpha * (b - b0))
    np.testing.assert_allclose(upload.params[wname][0].double().numpy(), w, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(upload.params[bname][0].double().numpy(), b, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(new[GRAD + wname][0].double().numpy(), gw - alpha * (w - w0), rtol=1e-4, atol=1e-5)
    assert set(upload.params) == set(names) and not any(n.startswith(GRAD) for n in upload.params)


def test_feddyn_server_keeps_h_and_corrects_the_average():
    fed = _fed(clients=5)
    alpha = 0.2
    algo, server, _ = _setup("feddyn", fed, TrainConfig(), {"alpha": alpha})
    rng = np.random.default_rng(0)
    theta = {k: v.double().numpy() for k, v in server.params.items()}
    h = {k: np.zeros_like(v) for k, v in theta.items()}
    state = server
    for _ in range(3):
        clients = [0, 2, 3]
        models = {k: rng.normal(size=(3, *v.shape)) for k, v in theta.items()}
        up = Upload(clients, {k: torch.tensor(v, dtype=torch.float32) for k, v in models.items()},
                    torch.full((3,), 7.0))  # equal sizes: hetfed's weighted mean is the paper's plain one
        state = algo.aggregate(state, up)
        for k in theta:
            mean = models[k].mean(0)
            h[k] = h[k] - alpha * (1 / 5) * (models[k] - theta[k]).sum(0)
            theta[k] = mean - h[k] / alpha
            np.testing.assert_allclose(state.params[k].double().numpy(), theta[k], rtol=1e-4, atol=1e-5)


def test_fednova_normalises_unequal_local_work():
    """Clients of different sizes take different numbers of steps in one epoch; FedNova's server step from
    the clients' trained models y_i (FedAvg's uploads, the same training) by the paper's formula."""
    fed = _fed(clients=4, alpha=0.3)
    train = TrainConfig(local_epochs=1, batch_size=8, optimizer=OptimizerConfig(lr=0.1, momentum=0.0))
    nova, server, pool = _setup("fednova", fed, train)
    avg, _, _ = _setup("fedavg", fed, train)
    clients = [0, 1, 2, 3]
    states = stack_states([nova.client_init(k, torch_gen(0, CLIENT_INIT, k)) for k in clients])
    bc = nova.broadcast(server, 0)
    plain, _ = avg.local_update(bc, states, client_data(pool, clients, 0))
    up, _ = nova.local_update(bc, states, client_data(pool, clients, 0))
    new = nova.aggregate(server, up).params

    n = np.array([len(fed.train[k]) for k in clients], dtype=np.float64)
    tau = np.ceil(n / 8)  # one epoch of batches of 8
    assert len(set(tau)) > 1  # the case FedNova is for
    p = n / n.sum()
    tau_eff = (p * tau).sum()
    for k, x in server.params.items():
        x = x.double().numpy()
        y = plain.params[k].double().numpy()
        want = x - tau_eff * sum(p[i] * (x - y[i]) / tau[i] for i in range(4))
        np.testing.assert_allclose(new[k].double().numpy(), want, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(up.extra["steps"].numpy(), tau)


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_fednova_is_fedavg_when_every_client_takes_the_same_steps(momentum):
    fed = _fed(clients=4)
    train = TrainConfig(local_steps=3, batch_size=4, optimizer=OptimizerConfig(lr=0.05, momentum=momentum))
    nova, server, pool = _setup("fednova", fed, train)
    avg, _, _ = _setup("fedavg", fed, train)
    clients = [0, 1, 3]
    states = stack_states([nova.client_init(k, torch_gen(0, CLIENT_INIT, k)) for k in clients])
    bc = nova.broadcast(server, 0)
    a = avg.aggregate(server, avg.local_update(bc, states, client_data(pool, clients, 0))[0]).params
    b = nova.aggregate(server, nova.local_update(bc, states, client_data(pool, clients, 0))[0]).params
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6)
