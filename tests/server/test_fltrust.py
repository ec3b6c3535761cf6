"""FLTrust (Cao et al., NDSS 2021): the combine rule against the paper's Algorithm 1 written out, the server's update
against gradient descent on its root set written out with autograd, the root set a labelled holdout no client holds,
the executors and a stacked sweep agreeing, the attack it is built against held off, and the refusals."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.cli import main
from hetfed.config import AttackConfig, ModelConfig, ServerConfig, build_config
from hetfed.engine.local import LocalSchedule
from hetfed.engine.root import root_model
from hetfed.engine.types import Upload
from hetfed.errors import ConfigError
from hetfed.executors.inprocess import SequentialExecutor, VectorisedExecutor
from hetfed.executors.simulate import simulate
from hetfed.models import build_model
from hetfed.pipeline import build_federation
from hetfed.server.combine import parse
from tests.server.test_robust import _algo, _fed


def _paper(updates: np.ndarray, server: np.ndarray) -> np.ndarray:
    """Algorithm 1's aggregation, one client at a time: TS_i = ReLU(cos(g_i, g_0)), ḡ_i = ‖g_0‖/‖g_i‖ · g_i,
    g = Σ TS_i ḡ_i / Σ TS_j (zeros where every score, or g_0, is 0; an update of norm 0 trusted 0)."""
    g0 = float(np.linalg.norm(server))
    total, acc = 0.0, np.zeros_like(server)
    for g in updates:
        norm = float(np.linalg.norm(g))
        if norm == 0 or g0 == 0:
            continue
        ts = max(0.0, float(g @ server) / (norm * g0))
        total += ts
        acc += ts * (g0 / norm) * g
    return acc / total if total > 0 else np.zeros_like(server)


def _combine(old, updates: np.ndarray, server: np.ndarray):
    rule, params = parse({"rule": "fltrust"})
    n = len(updates)
    up = Upload(list(range(n)), {"w": torch.as_tensor(updates[:, :-1]) + old["w"],
                                 "b": torch.as_tensor(updates[:, -1:]) + old["b"]}, torch.rand(n) + 0.5)
    root = {"w": torch.as_tensor(server[:-1]) + old["w"], "b": torch.as_tensor(server[-1:]) + old["b"]}
    out = rule.combine(old, up, params, root=root)
    return torch.cat([out["w"] - old["w"], out["b"] - old["b"]]).numpy()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000), st.integers(1, 8), st.integers(2, 12), st.integers(0, 3), st.booleans())
def test_the_rule_is_the_papers_algorithm(seed, n, d, flipped, zero):
    rng = np.random.default_rng(seed)
    server = rng.normal(size=d)
    updates = server + rng.normal(size=(n, d))  # honest: around the server's direction, of other norms
    updates *= rng.uniform(0.1, 10, size=(n, 1))
    updates[: min(flipped, n)] *= -3  # flipped: pointing away, trusted 0
    if zero:
        updates[-1] = 0
    old = {"w": torch.as_tensor(rng.normal(size=d - 1)), "b": torch.as_tensor(rng.normal(size=1))}
    np.testing.assert_allclose(_combine(old, updates, server), _paper(updates, server), rtol=1e-9, atol=1e-12)


def test_flipped_and_huge_updates_count_for_nothing_more_than_the_servers_norm():
    rng = np.random.default_rng(0)
    server = rng.normal(size=5)
    honest = server + 0.1 * rng.normal(size=(3, 5))
    old = {"w": torch.zeros(4, dtype=torch.float64), "b": torch.zeros(1, dtype=torch.float64)}
    alone = _combine(old, honest, server)
    attacked = _combine(old, np.vstack([honest, -100 * honest]), server)  # sign-flipped and boosted: trust 0
    np.testing.assert_allclose(attacked, alone, rtol=1e-12)
    assert np.linalg.norm(_combine(old, 1000 * honest, server)) <= np.linalg.norm(server) * (1 + 1e-12)
    np.testing.assert_array_equal(_combine(old, -honest, server), np.zeros(5))  # no trust at all: no update


def test_the_servers_update_is_gradient_descent_on_its_root_set():
    """Full batches (B larger than the root set) and no momentum: the batches' order cannot matter, so the server's
    model is plain gradient descent on the mean cross-entropy of its root set, written out with autograd."""
    fed = _fed()
    algo, cfg = _algo(fed, optimizer={"kind": "sgd", "lr": 0.3, "momentum": 0.0}, batch_size=256, local_steps=3)
    rng = np.random.default_rng(1)
    x = torch.as_tensor(rng.normal(size=(40, *fed.input_shape)), dtype=torch.float32)
    y = torch.as_tensor(rng.integers(0, fed.n_classes, 40))
    reference = algo.server_init(torch.Generator().manual_seed(0)).params
    kept = {k: v.clone() for k, v in reference.items()}
    got = root_model(algo.model, reference, x, y, LocalSchedule.from_train(cfg), cfg.optimizer, 0.3, seed=7, rnd=2)
    mine = {k: v.clone().requires_grad_(True) for k, v in reference.items()}
    for _ in range(3):
        logits = algo.model.forward({k: v.unsqueeze(0) for k, v in mine.items()}, x.unsqueeze(0), None)[0]
        grads = torch.autograd.grad(torch.nn.functional.cross_entropy(logits, y), list(mine.values()))
        mine = {k: (v - 0.3 * g).detach().requires_grad_(True) for (k, v), g in zip(mine.items(), grads, strict=True)}
    for k in reference:
        torch.testing.assert_close(got[k], mine[k].detach(), rtol=1e-5, atol=1e-6)
        assert not torch.equal(got[k], reference[k])  # it trained
        assert torch.equal(reference[k], kept[k])  # and left the server's model as it was


def test_the_server_trains_each_round_at_the_rate_its_clients_were_sent(monkeypatch):
    import hetfed.interface as interface

    seen = []
    original = interface.root_model
    monkeypatch.setattr(interface, "root_model", lambda *a: seen.append((a[-3], a[-1])) or original(*a))
    fed = _with_root(_fed())
    algo, cfg = _algo(fed, combine={"rule": "fltrust"}, rounds=3, lr_decay=0.5)
    simulate(algo, fed, cfg, seed=0, executor=VectorisedExecutor())
    assert seen == [(pytest.approx(0.05 * 0.5**r), r) for r in range(3)]


def _with_root(fed, n=40):
    rng = np.random.default_rng(3)
    rows = rng.choice(len(fed.x), n, replace=False)
    return replace(fed, server_x=np.asarray(fed.x)[rows], server_y=np.asarray(fed.y)[rows])


@pytest.mark.parametrize("kind", ["sign_flip", "alie"])
def test_executors_agree_under_fltrust(kind):
    fed = _with_root(_fed())
    results = []
    for executor in (VectorisedExecutor(), SequentialExecutor()):
        algo, cfg = _algo(fed, combine={"rule": "fltrust"}, client_dropout=0.2)
        results.append(simulate(algo, fed, cfg, seed=1, executor=executor,
                                attack=AttackConfig(kind=kind, fraction=0.3)))
    a, b = results
    for k in a.server.params:
        torch.testing.assert_close(a.server.params[k], b.server.params[k], rtol=1e-5, atol=1e-6)


def test_without_a_root_set_the_algorithm_refuses_to_bind():
    algo, cfg = _algo(_fed(), combine={"rule": "fltrust"})
    with pytest.raises(Exception, match="labelled root set"):
        simulate(algo, _fed(), cfg, seed=0, executor=VectorisedExecutor())


def test_the_root_set_is_a_labelled_holdout_no_client_holds():
    cfg = build_config({"partition": {"kind": "dirichlet", "clients": 5, "alpha": 0.5},
                        "server_data": {"max_samples": 50},
                        "methods": [{"algorithm": "fedavg", "server": {"combine": {"rule": "fltrust"}}}]})
    built = build_federation(cfg, progress=False)
    fed, data = built.federation, built.data
    assert fed.server_x is not None and fed.server_y is not None and len(fed.server_y) == 50
    rows = {tuple(r) for r in np.asarray(data.x_train).round(6)}
    pairs = dict(zip(map(tuple, np.asarray(data.x_train).round(6)), np.asarray(data.y_train), strict=False))
    held = [tuple(r) for r in fed.server_x.round(6)]
    assert all(r in rows for r in held) and [pairs[r] for r in held] == list(fed.server_y)  # its own labels
    clients = {tuple(r) for r in np.asarray(fed.x).round(6)}
    assert not clients & set(held)  # no client's sample
    plain = build_federation(build_config({**cfg.model_dump(mode="json"), "methods": [{"algorithm": "feddf"}]}),
                             progress=False).federation
    assert plain.server_x is not None and plain.server_y is None  # FedDF's holdout stays unlabeled


def test_fltrust_holds_against_sign_flipping_where_the_mean_does_not(tmp_path):
    out = tmp_path / "r"
    code = main(["run", "--quiet", "--set", "attack.kind=sign_flip", "--set", "attack.fraction=0.3",
                 "--set", "train.rounds=20", "--set", "server_data.max_samples=100", "--set",
                 "methods=[{name: mean, algorithm: fedavg}, "
                 "{name: fltrust, algorithm: fedavg, server: {combine: {rule: fltrust}}}]", "--out", str(out)])
    assert code == 0
    methods = json.loads((out / "summary.json").read_text())["methods"]
    final = {name: m["final"]["global_accuracy"] for name, m in methods.items()}
    assert final["mean"] < 0.2 and final["fltrust"] > 0.5, final  # 0.100 and 0.691 when written


@pytest.mark.parametrize("source", ["none", "dataset"])
def test_fltrust_without_a_holdout_is_refused_in_one_line(tmp_path, capsys, source):
    out = tmp_path / "r"
    extra = ["--set", "server_data.name=digits"] if source == "dataset" else []
    code = main(["run", "--quiet", "--set", f"server_data.source={source}", *extra,
                 "--set", "methods=[{name: t, algorithm: fedavg, server: {combine: {rule: fltrust}}}]",
                 "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"server_data.source = {source!r}" in err and "methods.0.server.combine.rule = 'fltrust'" in err
    assert "expected 'auto' or 'holdout'" in err and not out.exists()



def _mlp_algorithms() -> list[str]:
    from hetfed.algorithms import registry

    return [n for n in registry.names() if registry.get(n).capabilities.server_model
            and (registry.get(n).capabilities.model_kinds is None or "mlp" in registry.get(n).capabilities.model_kinds)]


@pytest.mark.parametrize("name", _mlp_algorithms())
def test_fltrust_trains_the_servers_model_of_every_method_that_holds_one_whole_and_refuses_the_others(name):
    """``Capabilities.whole_model`` is what decides: a method with it trains its server's model on the root set
    (every shared parameter of the model, under its names), one without it is refused at bind."""
    import hetfed.interface as interface
    from hetfed.algorithms import build_algorithm, registry

    fed = _with_root(_fed())
    _, cfg = _algo(fed, rounds=1)
    mlp = ModelConfig(kind="mlp", hidden=[8])
    algo = build_algorithm(name, build_model(mlp, fed.input_shape, fed.n_classes), cfg,
                           server=ServerConfig(combine={"rule": "fltrust"}), in_features=int(np.prod(fed.input_shape)),
                           build=lambda n: build_model(mlp, fed.input_shape, n))
    if not registry.get(name).capabilities.whole_model:
        with pytest.raises(ConfigError, match="holds part of the model or several"):
            simulate(algo, fed, cfg, seed=0, executor=VectorisedExecutor())
        return
    trained = []
    original = interface.root_model
    try:
        interface.root_model = lambda model, reference, *a: trained.append(set(reference)) or original(
            model, reference, *a)
        simulate(algo, fed, cfg, seed=0, executor=VectorisedExecutor())
    finally:
        interface.root_model = original
    shared = {s.name for s in algo.model.specs() if not s.local}
    assert trained and all(names == shared for names in trained), name


def test_fltrust_with_a_method_whose_server_holds_part_of_the_model_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "r"
    code = main(["run", "--quiet", "--set", "methods=[{name: a, algorithm: fedavg}, "
                 "{name: p, algorithm: fedper, server: {combine: {rule: fltrust}}}]", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "methods.1.server.combine.rule = 'fltrust' is not allowed with methods.1.algorithm = 'fedper'" in err
    assert not out.exists()
