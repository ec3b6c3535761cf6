import json

import numpy as np
import pytest
import torch

from hetfed.algorithms import build_algorithm
from hetfed.cli import main
from hetfed.config import ModelConfig, OptimizerConfig, PartitionConfig, TrainConfig
from hetfed.engine.rng import torch_gen
from hetfed.engine.types import Broadcast, ClientData
from hetfed.executors.inprocess import SequentialExecutor, VectorisedExecutor
from hetfed.executors.simulate import simulate
from hetfed.models import build_model
from hetfed.models.cgau import CGAUNet
from hetfed.partition import make_federation


def test_cgau_layer_matches_the_equation():
    model = CGAUNet(3, [4], 2, dropout=0.0)
    gen = torch.Generator().manual_seed(0)
    p = {**model.init_shared(gen), **{k: torch.randn(v.shape, generator=gen) for k, v in model.init_local(gen).items()}}
    x = torch.randn(5, 3)
    f = torch.tanh(x @ p["cgau.0.filter.weight"] + p["cgau.0.filter.bias"] + p["cgau.0.filter.cond"])
    g = torch.sigmoid(x @ p["cgau.0.gate.weight"] + p["cgau.0.gate.bias"] + p["cgau.0.gate.cond"])
    expected = (f * g) @ p["out.weight"] + p["out.bias"]
    out = model.forward({k: v.unsqueeze(0) for k, v in p.items()}, x.unsqueeze(0))[0]
    torch.testing.assert_close(out, expected)
    # the conditioning is V·h for one-hot h: exactly one row per client
    assert set(model.local_names) == {"cgau.0.filter.cond", "cgau.0.gate.cond"}
    assert "out.cond" in CGAUNet(3, [4], 2, condition_output=True).local_names


class _Data:
    def __init__(self):
        rng = np.random.default_rng(0)
        self.y_train = rng.integers(0, 3, 300)
        self.x_train = (rng.normal(size=(300, 6)) + self.y_train[:, None]).astype(np.float32)
        self.y_test = np.repeat(np.arange(3), 10)
        self.x_test = (rng.normal(size=(30, 6)) + self.y_test[:, None]).astype(np.float32)
        self.n_classes = 3
        self.input_shape = (6,)


def _setup():
    fed = make_federation(_Data(), PartitionConfig(kind="feature_clusters", clients=4), 0)
    train = TrainConfig(rounds=2, local_steps=3, optimizer=OptimizerConfig(lr=0.1))
    model = build_model(ModelConfig(kind="cgau", hidden=[8, 8], dropout=0.5), fed.input_shape, fed.n_classes)
    return fed, train, model, build_algorithm("fedavg", model, train)


def test_uploads_carry_no_conditioning_and_server_ignores_it():
    fed, train, model, algo = _setup()
    server = algo.server_init(torch_gen(0, 1))
    bc = Broadcast(server.params, 0, 0.1)
    states = {k: v.unsqueeze(0).expand(2, *v.shape).clone() for k, v in model.init_local(torch.Generator()).items()}
    data = ClientData([0, 1], torch.as_tensor(fed.x), torch.as_tensor(fed.y), [fed.train[0], fed.train[1]], [1, 2])
    upload, new_states = algo.local_update(bc, states, data)
    assert not any("cond" in k for k in upload.params)
    assert set(upload.params) == set(model.shared_names)
    assert set(new_states) == set(model.local_names)
    assert not torch.equal(new_states["cgau.0.filter.cond"], states["cgau.0.filter.cond"])  # trained locally
    agg = algo.aggregate(server, upload)
    assert set(agg.params) == set(model.shared_names)  # the server never holds conditioning


def test_server_state_is_unchanged_by_a_clients_conditioning_when_it_is_not_sampled():
    fed, train, model, algo = _setup()
    r1 = simulate(algo, fed, train, 0, executor=VectorisedExecutor())
    # perturb one client's conditioning after training: the server's params do not depend on it
    before = {k: v.clone() for k, v in r1.server.params.items()}
    bc_before = algo.broadcast(r1.server, 2)
    r1.states[0]["cgau.0.filter.cond"] += 10
    assert all(torch.equal(before[k], r1.server.params[k]) for k in before)
    bc_after = algo.broadcast(r1.server, 2)
    assert all(torch.equal(bc_before.params[k], bc_after.params[k]) for k in bc_before.params)
    assert not any("cond" in k for k in bc_after.params)


def test_cgau_executors_agree_with_dropout():
    fed, train, model, algo = _setup()
    a = simulate(algo, fed, train, 0, executor=SequentialExecutor())
    b = simulate(algo, fed, train, 0, executor=VectorisedExecutor())
    for k in a.server.params:
        torch.testing.assert_close(a.server.params[k], b.server.params[k], rtol=1e-5, atol=1e-6)
    for c in a.states:
        for k in a.states[c]:
            torch.testing.assert_close(a.states[c][k], b.states[c][k], rtol=1e-5, atol=1e-6)


def test_unseen_client_accuracy_is_reported_separately():
    fed, train, model, algo = _setup()
    r = simulate(algo, fed, train, 0)
    m = r.history[-1][1].metrics
    assert {"server_accuracy", "global_accuracy", "local_accuracy_mean"} <= set(m)


def test_xor_demo_conditioning_does_the_work(tmp_path, capsys):
    assert main(["demo", "xor", "--out", str(tmp_path / "xor")]) == 0
    summary = json.loads((tmp_path / "xor" / "summary.json").read_text())
    cgau = summary["models"]["cgau_1_unit"]
    assert cgau["up"]["accuracy"] >= 0.95 and cgau["down"]["accuracy"] >= 0.95
    assert min(cgau["up"]["accuracy_no_cond"], cgau["down"]["accuracy_no_cond"]) < 0.85
    for name in ("decision_boundaries", "cgau_conditioning_off", "cgau_filter_gate"):
        assert (tmp_path / "xor" / "figures" / f"{name}.png").stat().st_size > 5000
    assert "cgau_1_unit" in capsys.readouterr().out


@pytest.mark.parametrize("seed", [1, 2])
def test_xor_demo_is_solved_on_other_seeds(tmp_path, seed):
    from hetfed.xor_demo import run_xor_demo

    _, summary = run_xor_demo(tmp_path / "x", seed=seed)
    cgau = summary["models"]["cgau_1_unit"]
    assert min(cgau["up"]["accuracy"], cgau["down"]["accuracy"]) >= 0.95


@pytest.mark.parametrize(("flag", "value", "expected"), [("--rounds", "0", "expected an integer ≥ 1"),
                                                          ("--rounds", "-3", "expected an integer ≥ 1"),
                                                          ("--seed", "-1", "expected an integer ≥ 0")])
def test_xor_demo_refuses_bad_rounds_and_seeds_before_writing(tmp_path, capsys, flag, value, expected):
    """`hetfed demo xor --rounds 0` (or --seed -1) ended in a traceback (exit 1) after making its directory."""
    from hetfed.cli import main

    out = tmp_path / "x"
    assert main(["demo", "xor", flag, value, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {flag} {value} is not allowed: {expected}", err
    assert not out.exists()
