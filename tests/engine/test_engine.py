import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.algorithms import build_algorithm, resolve_run, weighted_average
from hetfed.config import (
    ModelConfig,
    OptimizerConfig,
    PartitionConfig,
    ServerConfig,
    TrainConfig,
    build_config,
)
from hetfed.engine import optim
from hetfed.engine.local import LocalSchedule
from hetfed.engine.sampling import sample_clients
from hetfed.engine.step_plan import plan_batches
from hetfed.engine.types import Upload
from hetfed.errors import ConfigError
from hetfed.executors.inprocess import SequentialExecutor, VectorisedExecutor
from hetfed.executors.simulate import simulate
from hetfed.models import LeNet, build_model
from hetfed.models.mlp import MLP
from hetfed.partition import make_federation
from hetfed.pipeline import prepare
from tests.synthetic import ShiftedGaussians


def _dataset(n: int = 500, d: int = 12) -> ShiftedGaussians:
    """Unequal clients: a Dirichlet split of a small synthetic problem."""
    return ShiftedGaussians(n, d, classes=4, test_per_class=20)


def _fed(kind="dirichlet", clients=7, opt_out=0.0, seed=0):
    own = {"alpha": 0.5, "min_size": 5} if kind == "dirichlet" else {}
    return make_federation(_dataset(), PartitionConfig(kind=kind, clients=clients, opt_out=opt_out, **own), seed)


def _run(fed, train: TrainConfig, executor, algorithm="fedavg", model_cfg=None, seed=3, server=None):
    model = build_model(model_cfg or ModelConfig(hidden=[16, 16], dropout=0.3), fed.input_shape, fed.n_classes)
    return simulate(build_algorithm(algorithm, model, train, server=server), fed, train, seed, executor=executor)


EQUIV_TRAINS = [
    TrainConfig(rounds=3, local_epochs=2, batch_size=8, optimizer=OptimizerConfig(lr=0.05, momentum=0.9)),
    TrainConfig(rounds=3, local_steps=5, batch_size=16, steps_cap_one_pass=True, client_fraction=0.5,
                optimizer=OptimizerConfig(kind="adam", lr=0.01, reset_each_round=False)),
    TrainConfig(rounds=2, local_epochs=1, batch_size=10,
                optimizer=OptimizerConfig(lr=0.1, momentum=0.5, weight_decay=1e-3, reset_each_round=False),
                lr_decay=0.9),
]
#: the server step of each EQUIV_TRAINS case (the last one moves by a server lr and with FedAvgM)
EQUIV_SERVERS = [ServerConfig(), ServerConfig(optimizer={"kind": "adam", "lr": 0.05}),
                 ServerConfig(optimizer={"kind": "avgm", "lr": 0.7})]


@pytest.mark.parametrize("case", range(len(EQUIV_TRAINS)))
@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "local"])
def test_vectorised_equals_sequential(case, algorithm):
    fed = _fed()
    train, server = EQUIV_TRAINS[case], EQUIV_SERVERS[case]
    seq = _run(fed, train, SequentialExecutor(), algorithm, server=server)
    vec = _run(fed, train, VectorisedExecutor(), algorithm, server=server)
    chunked = _run(fed, train, VectorisedExecutor(chunk_clients=3), algorithm, server=server)
    for other in (vec, chunked):
        for k, v in seq.server.params.items():
            torch.testing.assert_close(other.server.params[k], v, rtol=1e-5, atol=1e-6)
        for c in seq.states:
            for k, v in seq.states[c].items():
                torch.testing.assert_close(other.states[c][k], v, rtol=1e-5, atol=1e-6)
        for (r1, e1), (r2, e2) in zip(seq.history, other.history, strict=True):
            assert r1 == r2
            for k, v in e1.metrics.items():
                assert e2.metrics[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k


def test_cnn_executors_agree():
    rng = np.random.default_rng(0)
    data = _dataset(n=120, d=64)
    data.x_train = rng.random((120, 64)).astype(np.float32)
    data.x_test = rng.random((80, 64)).astype(np.float32)
    data.input_shape = (8, 8)
    fed = make_federation(data, PartitionConfig(kind="iid", clients=3), 0)
    train = TrainConfig(rounds=2, local_epochs=1, batch_size=16)
    a = _run(fed, train, SequentialExecutor(), model_cfg=ModelConfig(kind="cnn"))
    b = _run(fed, train, VectorisedExecutor(), model_cfg=ModelConfig(kind="cnn"))
    for k, v in a.server.params.items():
        torch.testing.assert_close(b.server.params[k], v, rtol=1e-4, atol=1e-5)


def test_dropout_is_used_and_seeded():
    fed = _fed()
    train = EQUIV_TRAINS[0]
    with_drop = _run(fed, train, VectorisedExecutor())
    again = _run(fed, train, VectorisedExecutor())
    other_seed = _run(fed, train, VectorisedExecutor(), seed=4)
    no_drop = _run(fed, train, VectorisedExecutor(), model_cfg=ModelConfig(hidden=[16, 16], dropout=0.0))
    w = "layers.0.weight"
    assert torch.equal(with_drop.server.params[w], again.server.params[w])
    assert not torch.allclose(with_drop.server.params[w], other_seed.server.params[w])
    assert not torch.allclose(with_drop.server.params[w], no_drop.server.params[w])


def test_fedavg_aggregation_by_hand():
    old = {"w": torch.zeros(2)}
    up = Upload([0, 1, 2], {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])}, torch.tensor([1.0, 1.0, 2.0]))
    # (1·[1,2] + 1·[3,4] + 2·[5,6]) / 4 = [3.5, 4.5]
    torch.testing.assert_close(weighted_average(old, up)["w"], torch.tensor([3.5, 4.5]))
    torch.testing.assert_close(weighted_average(old, up, server_lr=0.5)["w"], torch.tensor([1.75, 2.25]))


def test_one_round_matches_hand_fedavg():
    """One round with one full-batch SGD step per client equals the hand computation."""
    fed = _fed(kind="iid", clients=3)
    train = TrainConfig(rounds=1, local_steps=1, batch_size=10_000, optimizer=OptimizerConfig(lr=0.5, momentum=0.0))
    model = MLP(fed.x.shape[1], [], fed.n_classes)
    algo = build_algorithm("fedavg", model, train)
    from hetfed.engine.rng import SERVER_INIT, torch_gen

    init = model.init_shared(torch_gen(3, SERVER_INIT))
    result = simulate(algo, fed, train, 3, executor=VectorisedExecutor())
    expected = {k: torch.zeros_like(v) for k, v in init.items()}
    sizes = fed.train_sizes()
    for k in range(3):
        lin = torch.nn.Linear(fed.x.shape[1], fed.n_classes)
        with torch.no_grad():
            lin.weight.copy_(init["layers.0.weight"].T)
            lin.bias.copy_(init["layers.0.bias"])
        xb = torch.as_tensor(fed.x[fed.train[k]])
        yb = torch.as_tensor(fed.y[fed.train[k]])
        opt = torch.optim.SGD(lin.parameters(), lr=0.5)
        torch.nn.functional.cross_entropy(lin(xb), yb).backward()
        opt.step()
        expected["layers.0.weight"] += lin.weight.detach().T * sizes[k] / sizes.sum()
        expected["layers.0.bias"] += lin.bias.detach() * sizes[k] / sizes.sum()
    for k, v in expected.items():
        torch.testing.assert_close(result.server.params[k], v, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cfg", [OptimizerConfig(kind="sgd", lr=0.1, momentum=0.9, weight_decay=0.01),
                                 OptimizerConfig(kind="adam", lr=0.01, weight_decay=0.01),
                                 OptimizerConfig(kind="adamw", lr=0.01, weight_decay=0.1)])
def test_functional_optimisers_match_torch(cfg):
    torch.manual_seed(0)
    p0 = torch.randn(3, 4)
    grads = [torch.randn(3, 4) for _ in range(4)]
    ref = p0.clone().requires_grad_()
    topt = (torch.optim.SGD([ref], lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay) if cfg.kind == "sgd"
            else {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[cfg.kind]([ref], lr=cfg.lr,
                                                                                 weight_decay=cfg.weight_decay))
    params = {"p": p0.clone().unsqueeze(0)}
    state = optim.init_state(cfg, params)
    active = torch.tensor([True])
    for g in grads:
        ref.grad = g.clone()
        topt.step()
        params, state = optim.step(cfg, params, {"p": g.unsqueeze(0)}, state, cfg.lr, active)
    torch.testing.assert_close(params["p"][0], ref.detach(), rtol=1e-5, atol=1e-6)
    frozen, _ = optim.step(cfg, params, {"p": torch.ones(1, 3, 4)}, state, cfg.lr, torch.tensor([False]))
    assert torch.equal(frozen["p"], params["p"])


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_a_client_that_finished_stands_still_while_the_others_step_as_alone(kind):
    """The masked step (a stack where some clients finished): an active client moves exactly as it does alone, a
    finished one — its parameters and its optimiser state — not at all (weight decay included: AdamW's shrink)."""
    cfg = OptimizerConfig(kind=kind, lr=0.05, momentum=0.9 if kind == "sgd" else 0.0, weight_decay=0.1)
    gen = torch.Generator().manual_seed(5)
    start = {"w": torch.randn(2, 3, 4, generator=gen)}
    grads = [{"w": torch.randn(2, 3, 4, generator=gen)} for _ in range(3)]
    both = {"w": start["w"].clone()}
    state = optim.init_state(cfg, both)
    alone = {"w": start["w"][:1].clone()}
    state_alone = optim.init_state(cfg, alone)
    for g in grads:
        both, state = optim.step(cfg, both, g, state, cfg.lr, torch.tensor([True, False]), every=False)
        alone, state_alone = optim.step(cfg, alone, {"w": g["w"][:1]}, state_alone, cfg.lr, torch.tensor([True]))
    torch.testing.assert_close(both["w"][:1], alone["w"], rtol=1e-6, atol=1e-7)
    assert torch.equal(both["w"][1], start["w"][1])
    assert all(torch.all(v[1] == 0) for v in state.values())


@pytest.mark.parametrize("momentum,decay", [(0.0, 0.0), (0.9, 0.0), (0.9, 0.01), (0.0, 0.01)])
def test_sgds_every_client_path_is_its_masked_path_when_every_client_trains(momentum, decay):
    """The all-active step (one foreach call per operation over every parameter) moves parameters and momentum
    exactly as the masked step with every client active."""
    cfg = OptimizerConfig(kind="sgd", lr=0.1, momentum=momentum, weight_decay=decay)
    gen = torch.Generator().manual_seed(3)
    start = {"a": torch.randn(4, 3, 2, generator=gen), "b": torch.randn(4, 5, generator=gen)}
    grads = [{k: torch.randn(v.shape, generator=gen) for k, v in start.items()} for _ in range(3)]
    runs = []
    for every in (True, False):
        params = {k: v.clone() for k, v in start.items()}
        state = optim.init_state(cfg, params)
        for g in grads:
            params, state = optim.step(cfg, params, g, state, cfg.lr, torch.ones(4, dtype=torch.bool), every=every)
        runs.append((params, state))
    for got, want in zip(runs[0], runs[1], strict=True):
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)


def test_mlp_matches_torch_module():
    model = MLP(5, [7], 3)
    params = model.init_shared(torch.Generator().manual_seed(0))
    ref = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    with torch.no_grad():
        for i, j in ((0, 0), (2, 1)):
            ref[i].weight.copy_(params[f"layers.{j}.weight"].T)
            ref[i].bias.copy_(params[f"layers.{j}.bias"])
    x = torch.randn(4, 5)
    out = model.forward({k: v.unsqueeze(0) for k, v in params.items()}, x.unsqueeze(0))[0]
    torch.testing.assert_close(out, ref(x))


@pytest.mark.parametrize("shape", [(28, 28), (32, 32, 3), (8, 8)])
def test_lenet_shapes(shape):
    model = LeNet(shape, 10)
    params = {k: v.unsqueeze(0).repeat(2, *[1] * v.ndim) for k,
              v in model.init_shared(torch.Generator().manual_seed(0)).items()}
    x = torch.rand(2, 5, int(np.prod(shape)))
    assert model.forward(params, x).shape == (2, 5, 10)
    assert model.local_names == []


@pytest.mark.parametrize("size", [(28, 28), (7, 9)])
def test_cnn_pooling_equals_max_pool2d_in_value_and_gradient(size):
    """The CNNs' pooling is max_pool2d in both of its forms: elementwise maxima without autograd (evaluation),
    max_pool2d's own backward under autograd (training) — odd edges dropped in both."""
    from hetfed.models.cnn import _pool

    x = torch.randn(3, 6, *size, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 6, size[0] // 2, size[1] // 2, dtype=torch.float64)
    ref = torch.nn.functional.max_pool2d(x, 2)
    with torch.no_grad():
        torch.testing.assert_close(_pool(x), ref.detach(), rtol=0, atol=0)
    ours = _pool(x)
    torch.testing.assert_close(ours, ref)
    torch.testing.assert_close(torch.autograd.grad((ours * w).sum(), x)[0], torch.autograd.grad((ref * w).sum(), x)[0])


def test_cnns_train_one_client_at_a_time_on_a_cpu_and_in_stacks_elsewhere():
    """The CNNs' CPU forward is a loop over the stack's clients, so the vectorised executor does not stack them
    there (a stack only added padding: docs/scale.md); other models, and the CNNs on CUDA, keep their stacks."""
    from hetfed.models.base import Derived
    from hetfed.models.mixture import Mixture

    cnn, mlp = LeNet((28, 28), 10), MLP(784, [64], 10)
    executor = VectorisedExecutor()
    executor.device = torch.device("cpu")
    assert executor.chunk_size(cnn, 10) == 1 and executor.chunk_size(mlp, 10) > 1
    assert executor.chunk_size(Derived(cnn), 10) == 1  # a method's derived model of a CNN loops too
    assert executor.chunk_size(Mixture(lambda c: LeNet((28, 28), c), 10), 10) == 1
    assert cnn.stacks_clients("cuda") and not cnn.stacks_clients("cpu") and mlp.stacks_clients("cpu")


def test_lenet_cpu_loop_equals_vmap():
    from torch.func import vmap

    model = LeNet((28, 28), 10)
    gen = torch.Generator().manual_seed(0)
    params = {s.name: torch.stack([s.init(gen, s.shape) for _ in range(3)]) for s in model.specs()}
    x = torch.rand(3, 4, 784)
    out = model.forward(params, x)
    torch.testing.assert_close(out, vmap(model._one)(params, x))
    F = torch.nn.functional
    for i in range(3):  # LeNet as usually written: ReLU, then max-pooling
        p = {k: v[i] for k, v in params.items()}
        h = F.max_pool2d(F.relu(F.conv2d(x[i].view(-1, 1, 28, 28), p["conv1.weight"], p["conv1.bias"], padding=2)), 2)
        h = F.max_pool2d(F.relu(F.conv2d(h, p["conv2.weight"], p["conv2.bias"])), 2).flatten(1)
        h = F.relu(F.linear(h, p["fc1.weight"], p["fc1.bias"]))
        h = F.relu(F.linear(h, p["fc2.weight"], p["fc2.bias"]))
        torch.testing.assert_close(out[i], F.linear(h, p["fc3.weight"], p["fc3.bias"]))


def test_upload_holds_only_shared_params_and_counts():
    fed = _fed()
    train = TrainConfig(rounds=1, local_steps=2)
    model = build_model(ModelConfig(hidden=[8]), fed.input_shape, fed.n_classes)
    algo = build_algorithm("fedavg", model, train)
    captured = []
    real = algo.local_update

    def spy(bc, states, data):
        up, st = real(bc, states, data)
        captured.append(up)
        return up, st

    algo.local_update = spy
    simulate(algo, fed, train, 0, executor=VectorisedExecutor())
    up = captured[0]
    assert set(up.params) == set(model.shared_names)
    assert torch.equal(up.num_samples, torch.tensor([len(fed.train[k]) for k in up.client_ids], dtype=torch.float32))


@settings(max_examples=30, deadline=None)
@given(k=st.integers(1, 30), q=st.floats(0, 0.95), m=st.integers(1, 10), seed=st.integers(0, 100), r=st.integers(0, 50))
def test_opted_out_clients_never_sampled(k, q, m, seed, r):
    rng = np.random.default_rng(seed)
    opted = rng.random(k) < q
    if opted.all():
        opted[0] = False
    if m > (~opted).sum():  # a fixed m that cannot be met is an error, never silently clamped
        with pytest.raises(ConfigError, match="train.clients_per_round"):
            sample_clients(TrainConfig(clients_per_round=m), opted, seed, r)
    else:
        chosen = sample_clients(TrainConfig(clients_per_round=m), opted, seed, r)
        assert not opted[chosen].any()
        assert len(chosen) == m and len(set(chosen)) == len(chosen)
    frac = sample_clients(TrainConfig(client_fraction=0.5), opted, seed, r)
    assert not opted[frac].any() and len(frac) == max(1, round(0.5 * (~opted).sum()))


def test_opted_out_data_never_reaches_the_global_model():
    fed = _fed(opt_out=0.4)
    out = np.flatnonzero(fed.opted_out)
    train = TrainConfig(rounds=3, local_epochs=1, client_fraction=0.5)
    a = _run(fed, train, VectorisedExecutor())
    x2 = fed.x.copy()
    for k in out:
        x2[fed.train[k]] = 100.0  # poison every opted-out client's data
    from dataclasses import replace
    b = _run(replace(fed, x=x2), train, VectorisedExecutor())
    for k, v in a.server.params.items():
        assert torch.equal(v, b.server.params[k])


def test_schedule():
    s = LocalSchedule(batch_size=32, steps=10, cap_one_pass=True)
    assert s.n_steps(100) == 4 and s.n_steps(1000) == 10
    assert LocalSchedule(batch_size=32, steps=10).n_steps(100) == 10
    assert LocalSchedule(batch_size=10, epochs=2).n_steps(35) == 8
    batches = plan_batches(35, LocalSchedule(batch_size=10, epochs=1), 0)
    assert sorted(np.concatenate(batches).tolist()) == list(range(35)) and len(batches[-1]) == 5


def test_early_stopping_and_best_by_validation():
    fed = _fed()
    train = TrainConfig(rounds=60, local_epochs=1, patience=2, optimizer=OptimizerConfig(lr=1.0, momentum=0.9))
    res = _run(fed, train, VectorisedExecutor())
    assert res.stopped_early and res.rounds_done < 60
    vals = [ev.metrics["val_loss"] for _, ev in res.history]
    assert res.best.metrics["val_loss"] == min(vals)
    assert res.history[-1][0] - res.best_round == 2


def test_binary_task_reports_auc():
    cfg = build_config({"dataset": {"positive_class": 0}, "train": {"rounds": 3}, "partition": {"clients": 4}})
    prep = prepare(cfg, progress=False)
    res = _run(prep.federation, cfg.train, VectorisedExecutor(), model_cfg=cfg.model)
    m = res.history[-1][1].metrics
    assert 0.5 < m["global_auc"] <= 1 and "local_auc_mean" in m


def test_scoring_unequal_clients_in_size_blocks_gives_each_its_own_models_logits():
    """predict stacks clients of similar sizes together; each client's logits are still its own model's on
    its own samples, computed here one client at a time as the reference."""
    from hetfed.engine.evaluate import predict, size_blocks
    from hetfed.models import MLP

    model = MLP(6, [5], 3)
    gen = torch.Generator().manual_seed(0)
    n = 7
    params = {s.name: torch.stack([s.init(gen, s.shape) for _ in range(n)]) for s in model.specs()}
    x = torch.randn(500, 6, generator=gen)
    sizes = [300, 2, 0, 40, 41, 1, 120]
    rng = np.random.default_rng(0)
    index = [rng.choice(500, size, replace=False) for size in sizes]
    blocks = size_blocks(np.array(sizes))
    assert sorted(np.concatenate(blocks).tolist()) == list(range(n)) and len(blocks) > 1
    for block in blocks:  # padding a block to its widest costs at most twice its samples
        assert len(block) * max(sizes[k] for k in block) <= 2 * max(sum(sizes[k] for k in block), 1)
    reordered = [index[4], index[3], index[3][:39]]  # sizes 41, 40, 39: one block, taken in the order 2, 1, 0
    assert [b.tolist() for b in size_blocks(np.array([41, 40, 39]))] == [[2, 1, 0]]
    for idx in (index, reordered):
        stack = {name: v[: len(idx)] for name, v in params.items()}
        got = predict(model, stack, x, idx)
        for k in range(len(idx)):
            alone = model.forward({name: v[k:k + 1] for name, v in stack.items()},
                                  x[torch.as_tensor(idx[k])][None], None)[0]
            torch.testing.assert_close(got[k], alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("algorithm", ["fedavg", "cfl"])
def test_a_node_numbering_its_clients_from_an_offset_trains_them_as_the_federation_does(algorithm):
    """A Flower node with its own data numbers its clients from 0 and learns from the server where they sit in
    the federation (`number_from`). Its clients must then draw the federation's randomness (batch order,
    dropout, CGAU rows) and be named by their federation ids (CFL looks its cluster up by id): training and
    evaluating clients 4–6 on a node that holds only them equals doing it where the whole federation is."""
    from dataclasses import replace

    fed = _fed(clients=7)
    first = 4
    node_fed = replace(fed, train=fed.train[first:], val=fed.val[first:], test=fed.test[first:],
                       opted_out=fed.opted_out[first:])
    train = TrainConfig(rounds=1, local_steps=3, batch_size=8, eval_global_clients=2)
    model = build_model(ModelConfig(kind="cgau", hidden=[8], dropout=0.3), fed.input_shape, fed.n_classes)
    algo = build_algorithm(algorithm, model, train)
    cpu = torch.device("cpu")
    whole, node = VectorisedExecutor(), VectorisedExecutor()
    whole.start(resolve_run(algo, fed, train, 3), fed, cpu)
    node.start(resolve_run(algo, node_fed, train, 3, server=False), node_fed, cpu)
    bc = algo.broadcast(algo.server_init(torch.Generator().manual_seed(0)), 2)
    theirs = list(range(first, 7))
    unnumbered = node.train(bc, [0, 1, 2])
    assert unnumbered.client_ids == [0, 1, 2]  # the defect this guards: federation clients 0–2's streams
    node.number_from(first)
    expected, got = whole.train(bc, theirs), node.train(bc, [0, 1, 2])
    assert got.client_ids == theirs
    for k, v in expected.params.items():
        torch.testing.assert_close(got.params[k], v)
        assert not torch.allclose(unnumbered.params[k], v)
    for j, k in enumerate(theirs):
        for name, v in whole.states[k].items():
            torch.testing.assert_close(node.states[j][name], v)
    reports, reference = node.evaluate(bc, [0, 1, 2]), whole.evaluate(bc, theirs)
    assert reports.keys() == reference.keys()
    for key, values in reference.items():  # NaN: the client that does not score the global test set
        np.testing.assert_array_equal(np.asarray(reports[key], dtype=float), np.asarray(values, dtype=float), key)


def test_a_kept_plan_layout_gives_the_plans_of_a_fresh_one(monkeypatch):
    """What a round's plan takes from the clients' sizes alone is kept for the next rounds: a later round of the same
    sizes (other clients, other seeds) gets exactly the plan built from scratch."""
    import numpy as np

    from hetfed.engine import step_plan
    from hetfed.engine.local import LocalSchedule
    from hetfed.engine.step_plan import plan_steps
    from hetfed.engine.types import ClientData

    schedule = LocalSchedule(batch_size=4, epochs=1.5)
    x, y = torch.zeros(60, 1), torch.zeros(60)
    sizes = [7, 0, 13, 3]
    starts = np.cumsum([0, *sizes[:-1]])

    def data(seeds, shift):
        return ClientData([0, 1, 2, 3], x, y, [np.arange(s, s + m) + shift for s, m in zip(starts, sizes, strict=True)],
                          seeds)

    first = plan_steps(data([1, 2, 3, 4], 0), schedule, torch.device("cpu"))
    kept = plan_steps(data([5, 6, 7, 8], 30), schedule, torch.device("cpu"))
    monkeypatch.setattr(step_plan, "KEEP_LAYOUT_UP_TO", -1)  # built from scratch: none kept, none found
    monkeypatch.setattr(step_plan, "_KEPT", {})
    fresh = plan_steps(data([5, 6, 7, 8], 30), schedule, torch.device("cpu"))
    for field in ("index", "mask", "active", "steps", "keys"):
        assert torch.equal(getattr(kept, field), getattr(fresh, field)), field
    assert (kept.rows, kept.widths, kept.every) == (fresh.rows, fresh.widths, fresh.every)
    assert not torch.equal(first.index, kept.index)  # other seeds and pool positions: another plan
    assert int(kept.index[2][kept.mask[2] > 0].min()) >= 30  # each client's own pool positions
