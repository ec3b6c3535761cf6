"""SCAFFOLD against the paper's equations (Karimireddy et al. 2020, Algorithm 1), written here, not from hetfed."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hetfed.algorithms import build_algorithm
from hetfed.algorithms.scaffold import CI, DC, effective_steps
from hetfed.config import ModelConfig, OptimizerConfig, PartitionConfig, TrainConfig
from hetfed.engine.rng import SERVER_INIT, torch_gen
from hetfed.engine.sampling import sample_clients
from hetfed.executors.inprocess import SequentialExecutor, VectorisedExecutor
from hetfed.executors.simulate import simulate
from hetfed.models import build_model
from hetfed.partition import make_federation
from tests.synthetic import ShiftedGaussians


def _dataset():
    return ShiftedGaussians(n=240, d=5, classes=3)


def _fed(clients=5):
    return make_federation(_dataset(), PartitionConfig(kind="dirichlet", clients=clients, alpha=0.3, min_size=10), 0)


def reference(fed, train: TrainConfig, x0: dict, seed: int, option: int) -> dict:
    """Algorithm 1 with full-batch local steps: logistic regression logits = x W + b, mean cross-entropy."""
    W, b = x0["layers.0.weight"].double(), x0["layers.0.bias"].double()
    c = [torch.zeros_like(W), torch.zeros_like(b)]
    c_i = {k: [torch.zeros_like(W), torch.zeros_like(b)] for k in range(fed.n_clients)}
    X, Y = torch.as_tensor(fed.x).double(), torch.as_tensor(fed.y)
    eta, K = train.optimizer.lr, train.local_steps

    def grad(params, idx):
        w, bb = (p.clone().requires_grad_(True) for p in params)
        loss = F.cross_entropy(X[idx] @ w + bb, Y[idx])
        return list(torch.autograd.grad(loss, [w, bb]))

    for r in range(train.rounds):
        S = sample_clients(train, fed.opted_out, seed, r)
        ys, sizes, dcs = [], [], []
        for k in S:
            idx = torch.as_tensor(fed.train[k])
            y = [W.clone(), b.clone()]
            for _ in range(K):
                g = grad(y, idx)
                y = [y[j] - eta * (g[j] - c_i[k][j] + c[j]) for j in range(2)]
            if option == 2:
                new = [c_i[k][j] - c[j] + ([W, b][j] - y[j]) / (K * eta) for j in range(2)]
            else:
                new = grad([W, b], idx)
            dcs.append([new[j] - c_i[k][j] for j in range(2)])
            c_i[k] = new
            ys.append(y)
            sizes.append(len(idx))
        w = torch.tensor(sizes, dtype=torch.float64) / sum(sizes)
        W = sum(w[i] * ys[i][0] for i in range(len(S)))
        b = sum(w[i] * ys[i][1] for i in range(len(S)))
        c = [c[j] + sum(d[j] for d in dcs) / fed.n_clients for j in range(2)]
    return {"layers.0.weight": W, "layers.0.bias": b, "c": c}


@pytest.mark.parametrize("option", [2, 1])
def test_rounds_match_the_papers_algorithm(option):
    """3 rounds, 2 of 5 clients each (so c ← c + ΣΔc_i/N with N = 5 ≠ |S| matters), K = 4 full-batch steps."""
    _matches_the_paper(option)


def test_option_one_in_passes_of_a_few_rows_matches_the_papers_algorithm(monkeypatch):
    """Option I's full gradient, summed over passes of each client's next rows where all its data at once would not
    fit :data:`FULL_GRADIENT_FLOATS` (a CNN on PFLlib's Fashion-MNIST clients), is the paper's ∇f_i(x)."""
    from hetfed.algorithms import scaffold

    monkeypatch.setattr(scaffold, "FULL_GRADIENT_FLOATS", 2 * 40)  # 2 clients × (≤ 35 floats a row): 1–2 rows a pass
    passes = []  # each pass's rows a client (its inputs' gather; its labels' is the other half)
    take = scaffold.take_rows
    monkeypatch.setattr(scaffold, "take_rows", lambda x, index: passes.append(index.shape[1]) or take(x, index))
    _matches_the_paper(1)
    assert len(passes) // 2 > 10 and max(passes) <= 2


def _matches_the_paper(option: int) -> None:
    fed = _fed()
    train = TrainConfig(rounds=3, clients_per_round=2, local_steps=4, batch_size=1000,
                        optimizer=OptimizerConfig(lr=0.2, momentum=0.0))
    model = build_model(ModelConfig(kind="logreg"), fed.input_shape, fed.n_classes)
    algo = build_algorithm("scaffold", model, train, {"option": option})
    x0 = algo.server_init(torch_gen(7, SERVER_INIT)).params
    result = simulate(algo, fed, train, 7, executor=SequentialExecutor())
    ref = reference(fed, train, x0, 7, option)
    for k in ("layers.0.weight", "layers.0.bias"):
        torch.testing.assert_close(result.server.params[k].double(), ref[k], rtol=1e-4, atol=1e-5)
    c = result.server.extra["c"]
    torch.testing.assert_close(c["layers.0.weight"].double(), ref["c"][0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(c["layers.0.bias"].double(), ref["c"][1], rtol=1e-4, atol=1e-5)
    assert float(ref["c"][0].abs().sum()) > 0  # the control variates did move


def test_executors_agree_with_momentum_and_chunks():
    fed = _fed()
    train = TrainConfig(rounds=3, client_fraction=0.6, local_epochs=2, batch_size=8,
                        optimizer=OptimizerConfig(lr=0.05, momentum=0.9))
    runs = []
    for ex in (SequentialExecutor(), VectorisedExecutor(), VectorisedExecutor(chunk_clients=2)):
        model = build_model(ModelConfig(hidden=[8]), fed.input_shape, fed.n_classes)
        runs.append(simulate(build_algorithm("scaffold", model, train), fed, train, 3, executor=ex))
    for other in runs[1:]:
        for k, v in runs[0].server.params.items():
            torch.testing.assert_close(other.server.params[k], v, rtol=1e-4, atol=1e-5)
        for k, v in runs[0].server.extra["c"].items():
            torch.testing.assert_close(other.server.extra["c"][k], v, rtol=1e-4, atol=1e-5)


def test_the_upload_carries_exactly_the_documented_fields_and_c_i_stays():
    from hetfed.engine.rng import CLIENT_INIT
    from hetfed.engine.types import stack_states
    from hetfed.executors.inprocess import Pool, client_data

    fed = _fed()
    train = TrainConfig(rounds=1, local_steps=2)
    model = build_model(ModelConfig(hidden=[8]), fed.input_shape, fed.n_classes)
    algo = build_algorithm("scaffold", model, train)
    algo.bind(fed)
    server = algo.server_init(torch_gen(0, SERVER_INIT))
    states = stack_states([algo.client_init(k, torch_gen(0, CLIENT_INIT, k)) for k in (0, 1)])
    pool = Pool(torch.as_tensor(fed.x), torch.as_tensor(fed.y), fed.train, 0, fed.val)
    upload, new = algo.local_update(algo.broadcast(server, 0), states, client_data(pool, [0, 1], 0))
    shared = set(model.shared_names)
    assert set(upload.params) == shared | {DC + k for k in shared}
    assert set(upload.extra) == {"train_loss"}
    assert {k for k in new if k.startswith(CI)} == {CI + k for k in shared}  # c_i is client state
    assert not any(k.startswith(CI) for k in upload.params)


def test_effective_steps():
    sgd = OptimizerConfig(momentum=0.0)
    assert effective_steps(5, sgd) == 5
    heavy = OptimizerConfig(momentum=0.9)
    assert effective_steps(1, heavy) == pytest.approx(1.0)
    # a constant gradient g moves η·Σ_{t=1..K} Σ_{s≤t} β^(t−s) g: count it directly
    beta, k = 0.9, 7
    direct = sum(sum(beta ** (t - s) for s in range(1, t + 1)) for t in range(1, k + 1))
    assert effective_steps(k, heavy) == pytest.approx(direct)
    assert effective_steps(4, OptimizerConfig(kind="adam", lr=0.01)) == 4


def test_scaffold_runs_on_the_default_config(tmp_path):
    from hetfed.cli import main

    code = main(["run", "--quiet", "--out", str(tmp_path / "r"), "--set", "train.rounds=5",
                 "--set", "methods.0.algorithm=scaffold", "--set", "methods.0.name=scaffold"])
    assert code == 0


@pytest.mark.parametrize("algorithm", ["scaffold", "feddyn"])
def test_the_servers_own_state_follows_its_model_to_the_runs_device(algorithm):
    """The server's control variate (SCAFFOLD's c, FedDyn's h) is made with the model on the host (``server_init``)
    while the run moves the model to its device: read beside the model, it must be there too (a lent H200 found both
    failing at round 1, "two devices"). The meta device stands in for the GPU here."""
    from hetfed.engine.types import ServerState, Upload

    fed = _fed(4)
    model = build_model(ModelConfig(kind="logreg"), fed.input_shape, fed.n_classes)
    algo = build_algorithm(algorithm, model, TrainConfig(rounds=1))
    algo.bind(fed, 0, 4)
    made = algo.server_init(torch_gen(0, SERVER_INIT))
    server = ServerState({k: v.to("meta") for k, v in made.params.items()}, made.round, made.extra)
    assert _devices(algo.broadcast(server, 0).extra) <= {"meta"}
    params = {k: v.unsqueeze(0).expand(2, *v.shape).clone() for k, v in server.params.items()}
    params.update({DC + k: torch.zeros(2, *v.shape, device="meta") for k, v in server.params.items()})
    new = algo.aggregate(server, Upload([0, 1], params, torch.ones(2, device="meta"),
                                        {"loss": torch.zeros(2, device="meta")}))
    assert _devices(new.extra) == {"meta"}


def _devices(value) -> set[str]:
    """The device types of every tensor in ``value`` (a tensor, or dicts of them)."""
    if isinstance(value, torch.Tensor):
        return {value.device.type}
    return set().union(*map(_devices, value.values())) if isinstance(value, dict) else set()
