"""Record-level DP in the local steps (DP-SGD, ``privacy.record``): a step is the noised mean of per-sample clipped
gradients, a client draws the same noise in any stack, ε is the worst client's, and what cannot be clipped per
sample is refused before any file."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.config import OptimizerConfig, RecordPrivacyConfig, build_config
from hetfed.engine.local import LocalSchedule, train_stack
from hetfed.engine.record_dp import draws_noise, record_epsilon
from hetfed.engine.types import ClientData
from hetfed.errors import ConfigError
from hetfed.models.mlp import MLP
from hetfed.runs.rundir import read_summary
from hetfed.runs.runner import run_experiment

SGD = OptimizerConfig(kind="sgd", lr=0.5, momentum=0.0)


def _stack(sizes=(6, 9), seed=0):
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.rand(sum(sizes), 12, generator=gen), torch.randint(0, 3, (sum(sizes),), generator=gen)
    starts = np.cumsum([0, *sizes[:-1]])
    data = ClientData(list(range(len(sizes))), x, y, [np.arange(s, s + n) for s, n in zip(starts, sizes, strict=True)],
                      [17 * k + 5 for k in range(len(sizes))])
    model = MLP(12, [8], 3)
    one = model.init_shared(torch.Generator().manual_seed(1))
    return model, {k: torch.stack([v] * len(sizes)) for k, v in one.items()}, data


def _schedule(sigma, clip, batch=100):
    return dataclasses.replace(LocalSchedule(batch, steps=1, capture="off"), records=RecordPrivacyConfig(
        noise_multiplier=sigma, clip=clip))


def test_a_noiseless_step_is_the_mean_of_per_sample_clipped_gradients():
    """σ = 0, one step over each client's whole data (B ≥ n): θ − lr · (1/B) Σ_i min(1, C/‖g_i‖) g_i, by hand."""
    model, params, data = _stack()
    clip, batch = 0.05, 100
    trained, _, _ = train_stack(model, params, data, _schedule(0.0, clip, batch), SGD, SGD.lr)
    for j, idx in enumerate(data.indices):
        total = {k: torch.zeros_like(v[j]) for k, v in params.items()}
        for i in idx:
            leaves = {k: v[j].clone().requires_grad_(True) for k, v in params.items()}
            loss = F.cross_entropy(model.forward({k: v[None] for k, v in leaves.items()},
                                                 data.x[i].reshape(1, 1, -1))[0],
                                   data.y[i].reshape(1))
            g = dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values())), strict=True))
            norm = torch.sqrt(sum((v ** 2).sum() for v in g.values()))
            for k in total:
                total[k] += g[k] * min(1.0, clip / float(norm))
        for k in params:
            torch.testing.assert_close(trained[k][j], params[k][j] - SGD.lr * total[k] / batch, rtol=1e-4, atol=1e-6)


@settings(max_examples=10, deadline=None)
@given(clip=st.floats(0.001, 2.0), seed=st.integers(0, 50))
def test_without_noise_a_step_moves_a_client_at_most_lr_times_the_clip(clip, seed):
    """The clipped mean over a batch has norm ≤ C (each of its ≤ B terms ≤ C, divided by B)."""
    model, params, data = _stack(seed=seed)
    trained, _, _ = train_stack(model, params, data, _schedule(0.0, clip, batch=8), SGD, SGD.lr)
    for j in range(2):
        moved = torch.sqrt(sum(((trained[k][j] - params[k][j]) ** 2).sum() for k in params))
        assert float(moved) <= SGD.lr * clip * (1 + 1e-4)


def test_a_clients_noise_is_its_own_whatever_stack_it_trains_in():
    """The noise is drawn from the client's stream (its round key, the step, the coordinate): alone or stacked, the
    same update; and it is there (σ > 0 changes the step)."""
    model, params, data = _stack()
    schedule = _schedule(1.0, 0.5, batch=4)
    both, _, _ = train_stack(model, params, data, schedule, SGD, SGD.lr)
    alone = ClientData([1], data.x, data.y, [data.indices[1]], [data.seeds[1]])
    one, _, _ = train_stack(model, {k: v[1:] for k, v in params.items()}, alone, schedule, SGD, SGD.lr)
    quiet, _, _ = train_stack(model, params, data, _schedule(0.0, 0.5, batch=4), SGD, SGD.lr)
    for k in params:
        torch.testing.assert_close(one[k][0], both[k][1], rtol=1e-5, atol=1e-6)
    assert any(not torch.allclose(both[k], quiet[k]) for k in params)


def test_epsilon_is_the_worst_clients_and_grows_with_steps_and_shrinks_with_noise():
    from hetfed.engine.privacy import epsilon

    worst = record_epsilon(1.0, 10, [50, 200], [30, 30], 1e-5)
    assert worst == pytest.approx(epsilon(1.0, 10 / 50, 30, 1e-5))  # the small client's q is the larger
    assert record_epsilon(1.0, 10, [50, 200], [60, 60], 1e-5) > worst > record_epsilon(2.0, 10, [50, 200], [30, 30],
                                                                                        1e-5)
    assert record_epsilon(1.0, 10, [50], [0], 1e-5) == 0.0


def _config(**over):
    base = {"dataset": {"name": "digits"}, "partition": {"kind": "dirichlet", "clients": 4, "alpha": 1.0},
            "model": {"kind": "mlp", "hidden": [16]},
            "train": {"rounds": 2, "batch_size": 16, "optimizer": {"kind": "sgd", "lr": 0.1}},
            "privacy": {"record": {"noise_multiplier": 1.0, "clip": 1.0}},
            "methods": [{"name": "fedavg", "algorithm": "fedavg"}]}
    base.update(over)
    return build_config(base)


def test_a_run_reports_the_record_level_epsilon_and_the_executors_agree(tmp_path):
    runs = {}
    for executor in ("vectorised", "sequential"):
        cfg = _config(train={"rounds": 2, "batch_size": 16, "executor": executor,
                             "optimizer": {"kind": "sgd", "lr": 0.1}})
        runs[executor] = run_experiment(cfg, out=tmp_path / executor, progress=False).run_dir
    summary = read_summary(runs["vectorised"])["methods"]["fedavg"]
    assert 0 < summary["record_epsilon"] < float("inf")
    from hetfed.runs.sweep_tables import run_values

    assert ("fedavg", "record_epsilon", summary["record_epsilon"]) in set(run_values(read_summary(runs["vectorised"])))
    a, b = ((d / "metrics.csv").read_text().splitlines() for d in runs.values())
    assert len(a) == len(b)
    for left, right in zip(a[1:], b[1:], strict=True):
        *key_a, value_a = left.split(",")
        *key_b, value_b = right.split(",")
        assert key_a == key_b and float(value_a) == pytest.approx(float(value_b), rel=1e-4, abs=1e-6), (left, right)


@pytest.mark.parametrize(("over", "message"), [
    ({"model": {"kind": "mlp", "hidden": [16], "dropout": 0.5}}, "is not allowed with dropout"),
    ({"methods": [{"name": "fedrep", "algorithm": "fedrep"}]}, "methods.0.algorithm = 'fedrep' is not allowed"),
])
def test_what_dp_sgd_cannot_clip_per_sample_is_refused_before_any_file(tmp_path, over, message):
    with pytest.raises(ConfigError, match=message):
        run_experiment(_config(**over), out=tmp_path / "bad", progress=False)
    assert not (tmp_path / "bad").exists()


def test_the_probe_sees_dropout():
    assert draws_noise(MLP(4, [8], 2, dropout=0.5), (4,)) and not draws_noise(MLP(4, [8], 2), (4,))


def test_a_checkpoint_from_before_a_field_existed_resumes_with_its_default():
    """A SimulationResult pickled before ``record_steps`` existed (an older hetfed's checkpoint) loads with it empty."""
    import pickle

    from hetfed.engine.types import ServerState
    from hetfed.executors.updates import SimulationResult

    old = SimulationResult(ServerState({}))
    del old.__dict__["record_steps"], old.__dict__["record_epsilon"]
    loaded = pickle.loads(pickle.dumps(old))
    assert loaded.record_steps == {} and loaded.record_epsilon is None and loaded.rounds_done == 0


def test_a_method_that_trains_twice_on_the_data_a_round_pays_for_both_passes(tmp_path):
    """Ditto trains its global and its personal model on the client's data every round: both passes are DP-SGD
    steps, and its ε composes them (twice FedAvg's steps here)."""
    cfg = _config(methods=[{"name": "fedavg", "algorithm": "fedavg"},
                           {"name": "ditto", "algorithm": "ditto", "params": {"lam": 0.1}}])
    methods = read_summary(run_experiment(cfg, out=tmp_path / "r", progress=False).run_dir)["methods"]
    assert methods["ditto"]["record_epsilon"] > methods["fedavg"]["record_epsilon"]
    view = np.load(tmp_path / "r" / "federation.npz")
    sizes = [int(n) for n in view["train"]]
    steps = [2 * 2 * max(1, -(-n // 16)) for n in sizes]  # 2 rounds × 2 passes × ⌈n / B⌉
    assert methods["ditto"]["record_epsilon"] == pytest.approx(record_epsilon(1.0, 16, sizes, steps, 1e-5))


def test_per_sample_norms_from_the_layers_equal_torch_funcs_and_serve_only_where_they_do():
    """Every trained parameter a dense layer's weight or bias: the norms from the layers' inputs and output gradients
    (one forward and one backward) equal torch.func's per-sample gradients' — the first step checks it, then they
    serve the model. A trained parameter outside the dense layers (CGAU's client rows) or used twice: not them."""
    from hetfed.engine import record_dp
    from hetfed.models.cgau import CGAUNet

    model, params, data = _stack(sizes=(5, 7, 4))
    xb = torch.rand(3, 6, 12, generator=torch.Generator().manual_seed(3))
    yb = torch.randint(0, 3, (3, 6), generator=torch.Generator().manual_seed(4))
    params = {k: v + 0.1 * torch.randn(v.shape, generator=torch.Generator().manual_seed(5)) for k, v in params.items()}
    leaves = {k: v for k, v in params.items() if k != "layers.0.bias"}  # one held fixed: no gradient of its own
    fixed = {"layers.0.bias": params["layers.0.bias"]}
    ghost = record_dp.ghost_norms(model, leaves, fixed, xb, yb)
    assert ghost is not None
    assert torch.allclose(ghost, record_dp.vmap_norms(model, leaves, fixed, xb, yb), rtol=1e-5, atol=1e-7)
    assert torch.equal(record_dp.per_sample_norms(model, leaves, fixed, xb, yb), ghost) and record_dp._GHOST[model]

    cgau = CGAUNet(12, [8], 3, dropout=0.0)
    gen = torch.Generator().manual_seed(6)
    cparams = {k: torch.stack([v] * 3) for k, v in {**cgau.init_shared(gen), **cgau.init_local(gen)}.items()}
    assert record_dp.ghost_norms(cgau, cparams, {}, xb, yb) is None  # its client rows are no dense layer's
    tied = {**params, "tied": params[sorted(params)[0]]}
    assert record_dp.ghost_norms(model, tied, {}, xb, yb) is None  # a trained tensor no layer reads
