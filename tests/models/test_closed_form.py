"""#47: a plain step's loss and gradients written out (:mod:`hetfed.models.closed_form`, the MLP's): autograd's numbers,
without autograd's fixed cost, and only where the step is the model's own forward."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.config import ModelConfig, OptimizerConfig
from hetfed.engine import local
from hetfed.engine.local import LocalSchedule, Proximal, cross_entropy, train_stack
from hetfed.models import MLP, build_model
from hetfed.models.base import Noise
from hetfed.models.cgau import CGAUNet
from hetfed.models.mlp import LogisticRegression
from tests.engine.test_stacking import _params, _stack_data


def _noise(n: int, seed: int) -> Noise:
    return Noise(torch.arange(n, dtype=torch.int64) * 7919 + seed, 3, [0] * n)


def _model(kind: str, d: int, hidden: list[int], classes: int, p: float, condition_output: bool):
    return MLP(d, hidden, classes, dropout=p) if kind == "mlp" else \
        CGAUNet(d, hidden, classes, dropout=p, condition_output=condition_output)


@settings(max_examples=120, deadline=None)
@given(kind=st.sampled_from(["mlp", "cgau"]), n=st.integers(1, 4), batch=st.integers(1, 6), d=st.integers(1, 7),
       hidden=st.lists(st.integers(1, 6), max_size=3), classes=st.integers(2, 5), p=st.sampled_from([0.0, 0.4]),
       condition_output=st.booleans(), seed=st.integers(0, 1000), part=st.integers(0, 1 << 20))
def test_a_closed_form_is_autograds_loss_and_gradients(kind, n, batch, d, hidden, classes, p, condition_output, seed,
                                                       part):
    """MLP and CGAU, any depth (logistic regression too), dropout, padding rows and clients without a real row, CGAU's
    conditioned output or not, every parameter trained or any part of them (the others held fixed, as FedRep's
    head or body): each client's mean cross-entropy and the trained parameters' gradients equal autograd's over the
    model's forward, in float64."""
    gen = torch.Generator().manual_seed(seed)
    model = _model(kind, d, hidden, classes, p, condition_output)
    params = {s.name: (torch.randn((n, *s.shape), generator=gen, dtype=torch.float64) * 0.7) for s in model.specs()}
    names = sorted(params)
    trained = {k for i, k in enumerate(names) if part >> i & 1} or set(names)  # a subset (by the bits of ``part``)
    x = torch.randn(n, batch, d, generator=gen, dtype=torch.float64)
    y = torch.randint(0, classes, (n, batch), generator=gen)
    real = torch.randint(0, batch + 1, (n,), generator=gen)
    mask = (torch.arange(batch)[None] < real[:, None]).to(torch.float64)

    leaves = {k: v.clone().requires_grad_(k in trained) for k, v in params.items()}
    loss = cross_entropy(model, leaves, x, y, mask, _noise(n, seed))
    expected = torch.autograd.grad(loss.sum(), [leaves[k] for k in sorted(trained)])

    closed = model.closed_form(trained)
    assert closed is not None
    got_loss, grads = closed(params, x, y, mask, _noise(n, seed), None)  # the same draws as the autograd forward
    torch.testing.assert_close(got_loss, loss.detach())
    assert set(grads) == trained
    for k, g in zip(sorted(trained), expected, strict=True):
        torch.testing.assert_close(grads[k], g, msg=k)


def test_a_forward_of_its_own_or_a_part_of_the_parameters_keeps_autograd():
    """Only the model's own forward is written out: a subclass or an instance that replaces the forward, a step that
    trains names the model does not have, and models without one (a CNN) go through autograd."""

    class Scaled(MLP):
        def forward(self, params, x, noise=None):
            return 2 * super().forward(params, x, noise)

    mlp = MLP(4, [3], 2)
    names = {s.name for s in mlp.specs()}
    assert mlp.closed_form(names) is not None
    assert LogisticRegression(4, 2).closed_form({"layers.0.weight", "layers.0.bias"}) is not None
    assert Scaled(4, [3], 2).closed_form(names) is None
    assert mlp.closed_form(names - {"layers.0.bias"}) is not None  # the bias held fixed
    assert mlp.closed_form(names | {"apfl.local.layers.0.bias"}) is None and mlp.closed_form(set()) is None
    patched = MLP(4, [3], 2)
    patched.forward = lambda params, x, noise=None: mlp.forward(params, x, noise)  # type: ignore[method-assign]
    assert patched.closed_form(names) is None
    cgau = CGAUNet(4, [3], 2)
    assert cgau.closed_form({s.name for s in cgau.specs()}) is not None
    assert cgau.closed_form(set(cgau.shared_names)) is not None
    cnn = build_model(ModelConfig(kind="cnn4"), (28, 28), 10)
    assert cnn.closed_form({s.name for s in cnn.specs()}) is None


def _closed_against_autograd(monkeypatch, model, params, opt, reg, trainable) -> list[int]:
    """``train_stack`` on unequal clients (the 5-client stack of :mod:`tests.engine.test_stacking`), first with the
    model's
    closed form turned off, then on: autograd's cross-entropy runs in the first and never in the second, and the
    parameters, optimiser state and loss agree. Returns the counter of autograd's steps (patched for the test)."""
    data, sched = _stack_data([37, 12, 50, 3, 24]), LocalSchedule(batch_size=8, epochs=2)
    by_autograd: list[int] = []
    monkeypatch.setattr(local, "cross_entropy", lambda *a: by_autograd.append(1) or cross_entropy(*a))
    cls = type(model)
    written_out = cls.closed_form
    monkeypatch.setattr(cls, "closed_form", lambda self, names: None)
    reference = train_stack(model, params, data, sched, opt, opt.lr, regulariser=reg, trainable=trainable)
    assert by_autograd
    by_autograd.clear()
    monkeypatch.setattr(cls, "closed_form", written_out)
    trained = train_stack(model, params, data, sched, opt, opt.lr, regulariser=reg, trainable=trainable)
    assert by_autograd == []
    for i in (0, 1):
        assert set(trained[i]) == set(reference[i])
        for k in reference[i]:
            torch.testing.assert_close(trained[i][k], reference[i][k], rtol=1e-5, atol=1e-6, msg=k)
    torch.testing.assert_close(trained[2], reference[2], rtol=1e-5, atol=1e-6)
    return by_autograd


@pytest.mark.parametrize("trainable", [None, ["layers.2.weight", "layers.2.bias"],
                                       ["layers.0.weight", "layers.0.bias", "layers.1.weight"]])
@pytest.mark.parametrize("opt,mu", [(OptimizerConfig(lr=0.1, momentum=0.9, weight_decay=0.01), None),
                                    (OptimizerConfig(kind="adam", lr=0.01), None),
                                    (OptimizerConfig(lr=0.1), 0.5)])
def test_train_stack_writes_out_plain_steps_and_gives_autograds_numbers(monkeypatch, opt, mu, trainable):
    """A plain step of an MLP runs its closed form, not autograd's cross-entropy, and trains unequal clients with
    dropout to autograd's parameters, optimiser state and loss — all its parameters, or a part with the others held
    fixed (FedRep's head, a body); a step with a loss term of the caller's runs autograd."""
    model = MLP(6, [16, 8], 4, dropout=0.3)
    params = _params(model, 5)
    reg = Proximal({k: v[0] for k, v in params.items()}, mu) if mu else None
    by_autograd = _closed_against_autograd(monkeypatch, model, params, opt, reg, trainable)
    train_stack(model, params, _stack_data([37, 12, 50, 3, 24]), LocalSchedule(batch_size=8, epochs=2), opt, opt.lr,
                regulariser=lambda p: sum((v ** 2).flatten(1).sum(1) for v in p.values()))
    assert by_autograd


@pytest.mark.parametrize("trainable", [None, ["cgau.0.filter.cond", "cgau.0.gate.cond", "cgau.1.filter.cond",
                                              "cgau.1.gate.cond"]])
def test_a_cgau_stack_trains_to_autograds_numbers(monkeypatch, trainable):
    """CGAU (dropout, conditioned output) on unequal clients under SGD with momentum, weight decay and a proximal term,
    all its parameters or its conditioning rows alone: the closed form's parameters, optimiser state and loss are
    autograd's."""
    model = CGAUNet(6, [16, 8], 4, dropout=0.3, condition_output=True)
    params = {k: v + 0.1 for k, v in _params(model, 5).items()}  # conditioning rows away from their zero start
    _closed_against_autograd(monkeypatch, model, params, OptimizerConfig(lr=0.1, momentum=0.9, weight_decay=0.01),
                             Proximal({k: v[0] for k, v in params.items()}, 0.3), trainable)


def test_the_registrys_mlp_declares_it_and_moves_every_weight_under_sgd():
    model = build_model(ModelConfig(kind="mlp", hidden=[8]), (5,), 3)
    current = {s.name: torch.zeros(1, *s.shape) for s in model.specs()}
    closed, fewest = local._update_path(model, current, OptimizerConfig(lr=0.1), None)
    assert closed is not None and fewest == 1  # a stack of any size moves its weights
    assert local._update_path(model, current, OptimizerConfig(kind="adam", lr=0.1), None)[1] == 0


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_a_proximal_shift_trains_as_its_linear_term_through_autograd(momentum):
    """SCAFFOLD's correction and FedDyn's linear term as a Proximal term's ``shift`` (added to the gradients in
    closed form, the step plain and cut to the clients still training) train unequal clients to the numbers of the
    same term written as a loss (``μ/2‖θ − c‖² + ⟨s, θ⟩``, autograd over every client), to float rounding; a shift
    turns off the moves in the backward (they fold in the centre, not the shift)."""
    model = MLP(6, [16, 8], 4, dropout=0.3)
    params = _params(model, 5)
    gen = torch.Generator().manual_seed(3)
    centre = {k: v[0] for k, v in params.items()}
    shift = {k: torch.randn(v.shape, generator=gen) * 0.1 for k, v in params.items()}  # each client's own
    opt = OptimizerConfig(lr=0.1, momentum=momentum)
    sched, data = LocalSchedule(batch_size=8, epochs=2), _stack_data([37, 12, 50, 3, 24])

    def as_loss(p):
        return sum((0.25 * (p[k] - centre[k]) ** 2 + shift[k] * p[k]).flatten(1).sum(1) for k in p)

    reference = train_stack(model, params, data, sched, opt, opt.lr, regulariser=as_loss)
    shifted = train_stack(model, params, data, sched, opt, opt.lr, regulariser=Proximal(centre, 0.5, shift))
    for a, b in zip(reference[:2], shifted[:2], strict=True):
        for k in a:
            torch.testing.assert_close(b[k], a[k], rtol=1e-5, atol=1e-6, msg=k)
    torch.testing.assert_close(shifted[2], reference[2], rtol=1e-5, atol=1e-6)
    current = {s.name: torch.zeros(1, *s.shape) for s in model.specs()}
    only_shift = Proximal({}, 0.0, {"layers.0.weight": current["layers.0.weight"]})
    assert local._update_path(model, current, opt, only_shift)[1] == 0
