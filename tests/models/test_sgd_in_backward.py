"""#47: a plain SGD step moves its linear layers' weights in the backward (one ``baddbmm_`` instead of a weight
gradient written and read back): the same numbers as the optimiser's update, to float tolerance. Two paths do it:
autograd's hook (:func:`hetfed.models.sgd_in_backward.linear`) and a model's step written out in closed form
(:mod:`hetfed.models.closed_form`: the MLP's)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetfed.config import OptimizerConfig
from hetfed.engine.local import LocalSchedule, Proximal, train_stack
from hetfed.models import MLP, closed_form, sgd_in_backward
from hetfed.models.sgd_in_backward import SGDInBackward, linear, updating
from tests.engine.test_stacking import _params, _stack_data, unequal_stack

#: the two ways a step moves its weights: autograd's hook (the MLP's closed form turned off) and the closed form
PATHS = ["hook", "closed form"]


def moves(monkeypatch, path: str, on: bool) -> None:
    """Weights of every size moved in the backward by ``path`` (``on``), or none (the optimiser's update)."""
    if path == "hook":
        monkeypatch.setattr(MLP, "closed_form", lambda self, names: None)
    monkeypatch.setattr(sgd_in_backward if path == "hook" else closed_form, "MOVE_FROM", 0 if on else 1 << 40)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 4), rows=st.integers(1, 6), d_in=st.integers(1, 7), d_out=st.integers(1, 5),
       lr=st.floats(1e-3, 1.0), decay=st.sampled_from([0.0, 0.01]), mu=st.sampled_from([0.0, 0.3]),
       own=st.booleans(), momentum=st.sampled_from([0.0, 0.9]))
def test_a_moved_weight_is_the_optimisers_update_of_its_gradient(monkeypatch, n, rows, d_in, d_out, lr, decay, mu, own,
                                                                 momentum):
    """``W ← W − lr·(∂L/∂W + decay·W + μ·(W − c))`` (with momentum: through ``v ← m·v + …``, ``W ← W − lr·v``)
    whether the backward moves W or the optimiser does; the input's and the bias's gradients are autograd's. (The same
    setting for every example: the fixture is not reset.)"""
    monkeypatch.setattr(sgd_in_backward, "MOVE_FROM", 0)
    gen = torch.Generator().manual_seed(n * 100 + rows)
    x = torch.randn(n, rows, d_in, generator=gen, dtype=torch.float64)
    w0, b0 = torch.randn(n, d_in, d_out, generator=gen, dtype=torch.float64), torch.randn(n, d_out, dtype=torch.float64)
    centre = torch.randn(n, d_in, d_out, generator=gen,
                         dtype=torch.float64) if own else torch.randn(d_in, d_out, dtype=torch.float64)

    def loss(out):
        return (out.tanh() ** 2).sum()

    xr, w, b = x.clone().requires_grad_(True), w0.clone().requires_grad_(True), b0.clone().requires_grad_(True)
    gx, gw, gb = torch.autograd.grad(loss(torch.baddbmm(b.unsqueeze(1), xr, w)), [xr, w, b])
    v0 = torch.randn(n, d_in, d_out, generator=gen, dtype=torch.float64)
    velocity = momentum * v0 + gw + decay * w0 + mu * (w0 - centre)
    expected = w0 - lr * (velocity if momentum else gw + decay * w0 + mu * (w0 - centre))

    xm, wm, bm = x.clone().requires_grad_(True), w0.clone().requires_grad_(True), b0.clone().requires_grad_(True)
    buffer = v0.clone()
    spec = SGDInBackward({"w": wm}, lr, decay + mu, {"w": centre} if mu else {}, mu, momentum,
                         {"w": buffer} if momentum else {})
    with updating(spec):
        out = linear(xm, wm, bm)
    hx, hw, hb = torch.autograd.grad(loss(out), [xm, wm, bm], allow_unused=True)
    assert hw is None and spec.moved == {"w"}
    torch.testing.assert_close(wm.detach(), expected)
    if momentum:
        torch.testing.assert_close(buffer, velocity)
    torch.testing.assert_close(hx, gx)
    torch.testing.assert_close(hb, gb)


def test_a_weight_used_twice_keeps_its_gradient_and_one_used_elsewhere_gets_the_other_uses_gradient(monkeypatch):
    monkeypatch.setattr(sgd_in_backward, "MOVE_FROM", 0)
    gen = torch.Generator().manual_seed(0)
    x, w0 = torch.randn(2, 3, 4, generator=gen), torch.randn(2, 4, 4, generator=gen)

    def forward(w, b, twice):
        h = linear(x, w, b)
        return linear(h, w, b).sum() if twice else h.sum() + (w ** 2).sum()

    def reference_grad(twice):
        w, b = w0.clone().requires_grad_(True), torch.zeros(2, 4, requires_grad=True)
        return torch.autograd.grad(forward(w, b, twice), [w])[0]

    def under_spec(twice, bias_trains=True):
        w, b = w0.clone().requires_grad_(True), torch.zeros(2, 4, requires_grad=bias_trains)
        spec = SGDInBackward({"w": w}, 0.1)
        with updating(spec):
            total = forward(w, b, twice)
        return w, spec, torch.autograd.grad(total, [w, b] if bias_trains else [w], allow_unused=True)[0]

    w, spec, g = under_spec(twice=True)  # not moved: its uses' gradients held for the optimiser
    assert g is None and spec.moved == set() and torch.equal(w.detach(), w0)
    torch.testing.assert_close(spec.held["w"], reference_grad(twice=True))
    w, spec, g = under_spec(twice=False, bias_trains=False)  # the bias does not train: autograd's gradient
    assert spec.moved == set() and spec.held == {}
    torch.testing.assert_close(g, reference_grad(twice=False))
    w, spec, g = under_spec(twice=False)  # moved by its layer's part; the square's part for the optimiser
    assert spec.moved == {"w"}
    torch.testing.assert_close(g, 2 * w0)
    torch.testing.assert_close(w.detach() - 0.1 * g, w0 - 0.1 * reference_grad(twice=False))


@pytest.mark.parametrize("opt,mu", [(OptimizerConfig(lr=0.1, momentum=0.0), None),
                                    (OptimizerConfig(lr=0.1, momentum=0.0, weight_decay=0.01), 0.5),
                                    (OptimizerConfig(lr=0.1, momentum=0.0), "own centres"),
                                    (OptimizerConfig(lr=0.05, momentum=0.9, weight_decay=0.01), None),
                                    (OptimizerConfig(lr=0.05, momentum=0.9), "own centres")])
@pytest.mark.parametrize("path", PATHS)
def test_a_plain_sgd_stack_moves_its_weights_in_the_backward_and_lands_where_the_optimiser_would(monkeypatch, opt, mu,
                                                                                                 path):
    """Unequal clients with dropout (a plain, compacted stack): moving the weights in the backward gives each client
    the parameters, momentum buffers and loss of the optimiser's update, with weight decay, momentum and a proximal
    term (one centre for all, or each client's own)."""
    model, _, data, params, sched, centre = unequal_stack(mu)
    reg = Proximal(centre, 0.3 if mu == "own centres" else mu) if mu else None
    moved: list[str] = []
    real_move = SGDInBackward.move

    def move(self, name, *a):
        real_move(self, name, *a)
        if name in self.moved:
            moved.append(name)

    monkeypatch.setattr(SGDInBackward, "move", move)
    moves(monkeypatch, path, on=False)  # the optimiser's update
    reference = train_stack(model, params, data, sched, opt, opt.lr, regulariser=reg)
    assert moved == []
    moves(monkeypatch, path, on=True)
    trained = train_stack(model, params, data, sched, opt, opt.lr, regulariser=reg)
    assert set(moved) == {"layers.0.weight", "layers.1.weight", "layers.2.weight"}
    for i in (0, 1):  # parameters, optimiser state
        assert set(trained[i]) == set(reference[i])
        for name in reference[i]:
            torch.testing.assert_close(trained[i][name], reference[i][name], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(trained[2], reference[2], rtol=1e-5, atol=1e-6)


def test_adam_and_a_loss_term_keep_the_optimisers_update(monkeypatch):
    opt = OptimizerConfig(kind="adam", lr=0.01)
    monkeypatch.setattr(sgd_in_backward, "MOVE_FROM", 0)
    monkeypatch.setattr(closed_form, "MOVE_FROM", 0)
    called: list[str] = []
    monkeypatch.setattr(SGDInBackward, "move", lambda self, name, *a: called.append(name))
    model = MLP(6, [16], 4)
    data, params = _stack_data([20, 9]), _params(model, 2)
    train_stack(model, params, data, LocalSchedule(batch_size=8), opt, opt.lr)
    train_stack(model, params, data, LocalSchedule(batch_size=8), OptimizerConfig(lr=0.1, momentum=0.0), 0.1,
                regulariser=lambda p: sum((v ** 2).flatten(1).sum(1) for v in p.values()))
    assert called == []


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("algorithm", ["fedavg", "fedprox", "ditto"])
def test_executors_agree_when_weights_move_in_the_backward(monkeypatch, algorithm, path):
    """Sequential (one client a stack) and vectorised (compacted stacks) executors, every weight moved in the
    backward: the same model, to float tolerance, as with the optimiser's update."""
    from hetfed.algorithms import build_algorithm
    from hetfed.config import ModelConfig, PartitionConfig, TrainConfig
    from hetfed.executors.inprocess import SequentialExecutor, VectorisedExecutor
    from hetfed.executors.simulate import simulate
    from hetfed.models import build_model
    from hetfed.partition import make_federation
    from tests.synthetic import ShiftedGaussians

    fed = make_federation(
        ShiftedGaussians(900, 6, classes=4),
        PartitionConfig(kind="dirichlet", clients=6, alpha=0.3, val_fraction=0.0, test_fraction=0.0),
        seed=0,
    )
    made = []
    real_move = SGDInBackward.move
    monkeypatch.setattr(SGDInBackward, "move", lambda self, *a: made.append(a[0]) or real_move(self, *a))
    results = {}
    for move_from, executor in ((1 << 40, SequentialExecutor()), (0, SequentialExecutor()), (0, VectorisedExecutor())):
        moves(monkeypatch, path, on=move_from == 0)
        model = build_model(ModelConfig(kind="mlp", hidden=[16], dropout=0.2), fed.input_shape, fed.n_classes)
        train = TrainConfig(rounds=2, client_fraction=1.0, eval_every=2, local_epochs=1, batch_size=10,
                            optimizer=OptimizerConfig(lr=0.05, momentum=0.5, weight_decay=1e-3))
        results[(move_from, type(executor).__name__)] = simulate(build_algorithm(algorithm, model, train), fed, train,
                                                                 1,
                                                                 executor=executor).server.params
        assert bool(made) == (move_from == 0)
        made.clear()
    reference = results[(1 << 40, "SequentialExecutor")]
    for other in list(results.values())[1:]:
        for k, v in reference.items():
            torch.testing.assert_close(other[k], v, rtol=1e-4, atol=1e-5)
