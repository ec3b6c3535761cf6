"""The zoos' methods (#48): each one's distinctive step against its paper's equations written in plain tensors.

The setting of tests/algorithms/test_personalised.py: a one-hidden-layer MLP, one client with six samples, plain SGD and
one full-batch step, so a round's update can be computed by hand.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hetfed.algorithms.fedlc import calibrated_loss
from hetfed.algorithms.moon import PREVIOUS, contrastive_loss
from tests.algorithms.test_personalised import BODY, HEAD, LR, _logits, _setup, _sgd

# ----------------------------------------------------------------------------------------------- FedLC


def _fedlc_by_hand(z: list[float], y: int, counts: list[float], tau: float, others: bool) -> float:
    """−log( exp(z_y − τ n_y^{−1/4}) / Σ_c exp(z_c − τ n_c^{−1/4}) ), the sum over c ≠ y when ``others``."""
    shifted = [zc - tau * max(n, 1e-8) ** -0.25 for zc, n in zip(z, counts, strict=True)]
    below = sum(math.exp(s) for c, s in enumerate(shifted) if not (others and c == y))
    return -math.log(math.exp(shifted[y]) / below)


@pytest.mark.parametrize("denominator", ["all", "others"])
def test_fedlc_calibrates_each_logit_by_the_clients_own_count_of_its_class(denominator):
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(2, 5, 4, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 4, (2, 5), generator=gen)
    counts = torch.tensor([[10.0, 3.0, 0.0, 1.0], [0.0, 0.0, 7.0, 2.0]], dtype=torch.float64)
    got = calibrated_loss(logits, y, counts, tau=0.7, denominator=denominator)
    for k in range(2):
        for i in range(5):
            want = _fedlc_by_hand(logits[k, i].tolist(), int(y[k, i]), counts[k].tolist(), 0.7, denominator == "others")
            assert got[k, i].item() == pytest.approx(want, rel=1e-9)


def test_fedlcs_paper_denominator_is_unbounded_below_where_the_cross_entropy_is_not():
    """With the label left out of the denominator, the loss falls without end as the label's logit grows (its
    gradient there is −1 whatever the margin): why the default is the cross-entropy of the calibrated logits."""
    counts = torch.tensor([[5.0, 5.0, 5.0]])
    y = torch.tensor([[0]])
    for big in (10.0, 100.0):
        z = torch.tensor([[[big, 0.0, 0.0]]], requires_grad=True)
        others = calibrated_loss(z, y, counts, 1.0, "others")
        assert others.item() < -big + 1
        (grad,) = torch.autograd.grad(others.sum(), z)
        assert grad[0, 0, 0].item() == pytest.approx(-1.0)
        assert calibrated_loss(z.detach(), y, counts, 1.0, "all").item() >= 0


def test_fedlc_descends_the_calibrated_loss_of_its_own_counts_and_reports_the_cross_entropy():
    tau = 0.5
    algo, server, state, data, x, y = _setup("fedlc", {"tau": tau})
    upload, _ = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    w = server.params
    counts = torch.bincount(y, minlength=2).float()  # this client's own: 3 and 3
    leaves = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    logits = _logits(leaves, x)
    shifted = logits - tau * counts.pow(-0.25)
    loss = F.cross_entropy(shifted, y)  # denominator "all": the cross-entropy of the calibrated logits
    grads = torch.autograd.grad(loss, list(leaves.values()))
    for (k, v), g in zip(w.items(), grads, strict=True):
        torch.testing.assert_close(upload.params[k][0], v - LR * g)
    torch.testing.assert_close(upload.extra["train_loss"][0], F.cross_entropy(logits, y).detach())


# ------------------------------------------------------------------------------------------------ MOON


def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1))


def test_moons_contrastive_loss_is_the_papers():
    gen = torch.Generator().manual_seed(5)
    z, zg, zp = (torch.randn(3, 4, 6, generator=gen, dtype=torch.float64) for _ in range(3))
    tau = 0.5
    want = -torch.log(torch.exp(_cos(z, zg) / tau) / (torch.exp(_cos(z, zg) / tau) + torch.exp(_cos(z, zp) / tau)))
    torch.testing.assert_close(contrastive_loss(z, zg, zp, tau), want)


def test_moon_adds_mu_times_the_contrastive_loss_and_keeps_its_trained_model_as_the_next_previous():
    mu, tau = 2.0, 0.5
    algo, server, state, data, x, y = _setup("moon", {"mu": mu, "tau": tau})
    w = server.params
    # the previous model starts as the server's initial draw (the authors' code); move it so both terms act
    prev = {k: state[PREVIOUS + k] + 0.2 for k in w}
    state = {**state, **{PREVIOUS + k: v for k, v in prev.items()}}
    upload, new = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)

    def rep(p, inputs):  # the representation: the hidden layer's output, before the head
        return torch.relu(inputs @ p[BODY[0]] + p[BODY[1]])

    leaves = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    z = rep(leaves, x)
    logits = z @ leaves[HEAD[0]] + leaves[HEAD[1]]
    pos, neg = _cos(z, rep(w, x)) / tau, _cos(z, rep(prev, x)) / tau
    con = -torch.log(torch.exp(pos) / (torch.exp(pos) + torch.exp(neg)))
    loss = F.cross_entropy(logits, y) + mu * con.mean()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    for (k, v), g in zip(w.items(), grads, strict=True):
        torch.testing.assert_close(upload.params[k][0], v - LR * g)
        torch.testing.assert_close(new[PREVIOUS + k][0], upload.params[k][0])  # the next round's z_prev
    torch.testing.assert_close(upload.extra["train_loss"][0], F.cross_entropy(logits, y).detach())


def test_moon_starts_every_clients_previous_model_at_the_servers_initial_model():
    algo, server, state, *_ = _setup("moon")
    for k, v in server.params.items():
        assert torch.equal(state[PREVIOUS + k], v)


def test_moon_with_mu_zero_is_fedavg():
    a = _setup("moon", {"mu": 0.0})
    b = _setup("fedavg")
    up_a, _ = a[0].local_update(a[0].broadcast(a[1], 0), {k: v.unsqueeze(0) for k, v in a[2].items()}, a[3])
    up_b, _ = b[0].local_update(b[0].broadcast(b[1], 0), {k: v.unsqueeze(0) for k, v in b[2].items()}, b[3])
    for k in up_b.params:
        torch.testing.assert_close(up_a.params[k], up_b.params[k])


def test_moon_refuses_a_model_without_a_representation_in_one_line():
    from hetfed.algorithms import build_algorithm
    from hetfed.config import ModelConfig, TrainConfig
    from hetfed.errors import ConfigError
    from hetfed.models import build_model

    model = build_model(ModelConfig(kind="mlp", hidden=[]), (3,), 2)
    with pytest.raises(ConfigError, match="moon"):
        build_algorithm("moon", model, TrainConfig())


def test_the_new_methods_stack_clients_independently():
    """A client's update does not depend on who shares its stack (the registry's executor parity tests check
    whole runs; this checks one stack of two clients against each alone)."""
    from hetfed.engine.types import ClientData

    for name in ("fedlc", "moon"):
        algo, server, state, data, x, y = _setup(name)
        two = ClientData([0, 1], x, y, [np.arange(6), np.arange(3, 6)], [123, 456])
        states = {k: torch.stack([v, v + 0.1]) for k, v in state.items()}
        both, _ = algo.local_update(algo.broadcast(server, 0), states, two)
        for i in range(2):
            one = ClientData([i], x, y, [two.indices[i]], [two.seeds[i]])
            alone, _ = algo.local_update(algo.broadcast(server, 0), {k: v[i:i + 1] for k, v in states.items()}, one)
            for k in alone.params:
                torch.testing.assert_close(both.params[k][i], alone.params[k][0])


# ---------------------------------------------------------------------------------------------- FedRoD


def test_fedrod_trains_body_and_generic_head_on_the_balanced_softmax_and_its_personal_head_on_the_sum():
    from hetfed.algorithms.fedrod import PERSONAL
    from hetfed.engine.types import ClientData

    algo, server, state, data, x, y = _setup("fedrod")
    picked = np.array([0, 1, 2, 4])  # labels 0, 1, 1, 1: counts 1 and 3, so the balanced softmax differs from CE
    data = ClientData([0], x, y, [picked], [123])
    w = server.params
    personal = {k: state[PERSONAL + k] + 0.1 for k in HEAD}  # the personal head starts as the initial head; move it
    state = {**state, **{PERSONAL + k: v for k, v in personal.items()}}
    upload, new = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    xs, ys = x[picked], y[picked]
    counts = torch.tensor([1.0, 3.0])

    leaves = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    z = torch.relu(xs @ leaves[BODY[0]] + leaves[BODY[1]])
    generic = z @ leaves[HEAD[0]] + leaves[HEAD[1]]
    bsm = F.cross_entropy(generic + counts.log(), ys)  # Ren et al.'s balanced softmax: logits + log n_c
    grads = torch.autograd.grad(bsm, list(leaves.values()))
    for (k, v), g in zip(w.items(), grads, strict=True):
        torch.testing.assert_close(upload.params[k][0], v - LR * g)

    p = {k: v.clone().requires_grad_(True) for k, v in personal.items()}
    out = generic.detach() + z.detach() @ p[HEAD[0]] + p[HEAD[1]]
    ce = F.cross_entropy(out, ys)
    grads = torch.autograd.grad(ce, list(p.values()))
    for (k, v), g in zip(personal.items(), grads, strict=True):
        torch.testing.assert_close(new[PERSONAL + k][0], v - LR * g)
    torch.testing.assert_close(upload.extra["train_loss"][0], ce.detach())

    # a client predicts with the generic logits plus its personal head's
    pred = algo.predictor(algo.broadcast(server, 1), new, 1)
    got = pred.model.forward(pred.params, x.unsqueeze(0))[0]
    held = pred.params
    z2 = torch.relu(x @ held[BODY[0]][0] + held[BODY[1]][0])
    want = z2 @ held[HEAD[0]][0] + held[HEAD[1]][0] + z2 @ held[PERSONAL + HEAD[0]][0] + held[PERSONAL + HEAD[1]][0]
    torch.testing.assert_close(got, want)
    assert pred.personalised


# -------------------------------------------------------------------------------------------- FedProto


def test_fedproto_regularises_towards_the_global_prototype_of_each_samples_class_and_uploads_its_own():
    from hetfed.engine.types import Broadcast

    lam = 0.7
    algo, server, state, data, x, y = _setup("fedproto", {"lam": lam})
    d = 4  # the hidden width: the representation
    prototypes = torch.randn(2, d, generator=torch.Generator().manual_seed(9))
    known = torch.tensor([1.0, 0.0])  # class 1 has no global prototype yet: no term for its samples
    bc = Broadcast({}, 0, LR, {"prototypes": prototypes, "known": known})
    upload, new = algo.local_update(bc, {k: v.unsqueeze(0) for k, v in state.items()}, data)
    w = {k: state[k] for k in (*BODY, *HEAD)}
    leaves = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    z = torch.relu(x @ leaves[BODY[0]] + leaves[BODY[1]])
    ce = F.cross_entropy(z @ leaves[HEAD[0]] + leaves[HEAD[1]], y)
    rows = torch.stack([((z[i] - prototypes[y[i]]) ** 2).mean() * known[y[i]] for i in range(len(y))])
    grads = torch.autograd.grad(ce + lam * rows.mean(), list(leaves.values()))
    trained = {k: (v - LR * g).detach() for (k, v), g in zip(w.items(), grads, strict=True)}
    for k in w:
        torch.testing.assert_close(new[k][0], trained[k])
    assert upload.params == {}
    z1 = torch.relu(x @ trained[BODY[0]] + trained[BODY[1]])  # the prototypes of the trained model
    for c in (0, 1):
        torch.testing.assert_close(upload.extra["prototypes"][0, c], z1[y == c].mean(0))
    assert upload.extra["label_counts"][0].tolist() == [3.0, 3.0]


def test_fedprotos_server_weights_each_clients_prototype_by_its_count_and_keeps_unreported_classes():
    from hetfed.engine.types import ServerState, Upload

    algo, server, *_ = _setup("fedproto")
    old = torch.full((2, 4), 5.0)
    state = ServerState({}, 3, {"prototypes": old, "known": torch.tensor([1.0, 1.0])})
    protos = torch.tensor([[[1.0, 1, 1, 1], [0, 0, 0, 0]], [[3.0, 3, 3, 3], [0, 0, 0, 0]]])
    counts = torch.tensor([[1.0, 0.0], [3.0, 0.0]])  # nobody holds class 1 this round
    up = Upload([0, 1], {}, torch.tensor([1.0, 3.0]), {"prototypes": protos, "label_counts": counts,
                                                       "train_loss": torch.zeros(2)})
    new = algo.aggregate(state, up)
    torch.testing.assert_close(new.extra["prototypes"][0], torch.full((4,), (1 * 1 + 3 * 3) / 4))
    torch.testing.assert_close(new.extra["prototypes"][1], old[1])
    assert new.round == 4


def test_fedproto_predicts_the_class_of_the_nearest_global_prototype():
    from hetfed.engine.types import Broadcast

    algo, server, state, data, x, y = _setup("fedproto")
    params = {k: v.unsqueeze(0) for k, v in state.items() if not k.startswith("opt.")}
    z = torch.relu(x @ state[BODY[0]] + state[BODY[1]])
    prototypes = torch.stack([z[0], z[1] + 10])  # sample 0 sits on class 0's prototype
    bc = Broadcast({}, 1, LR, {"prototypes": prototypes, "known": torch.tensor([1.0, 1.0])})
    pred = algo.predictor(bc, params, 1)
    logits = pred.model.forward(pred.params, x.unsqueeze(0))[0]
    want = -torch.stack([((z - p) ** 2).mean(-1) for p in prototypes], -1)
    torch.testing.assert_close(logits, want)
    assert logits[0].argmax() == 0


# ---------------------------------------------------------------------------------------------- FedDBE


def test_feddbe_first_round_trains_plainly_and_fixes_the_global_mean_from_the_running_means():
    from hetfed.algorithms.feddbe import MEMORY

    m = 0.1
    algo, server, state, data, x, y = _setup("feddbe", {"kappa": 2.0, "momentum": m})
    upload, new = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    w = server.params
    leaves = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    z = torch.relu(x @ leaves[BODY[0]] + leaves[BODY[1]])
    loss = F.cross_entropy(z @ leaves[HEAD[0]] + leaves[HEAD[1]], y)  # no memory, no regulariser yet
    grads = torch.autograd.grad(loss, list(leaves.values()))
    for (k, v), g in zip(w.items(), grads, strict=True):
        torch.testing.assert_close(upload.params[k][0], v - LR * g)
    torch.testing.assert_close(upload.extra["running_mean"][0], m * z.detach().mean(0))  # r = (1 − m)·0 + m·mean z
    assert torch.equal(new[MEMORY][0], state[MEMORY])  # untouched
    # the server: the sample-weighted mean of the running means, once
    from hetfed.engine.types import Upload

    two = Upload([0, 1], {k: torch.stack([v[0], v[0]]) for k, v in upload.params.items()}, torch.tensor([1.0, 3.0]),
                 {"train_loss": torch.zeros(2), "running_mean": torch.stack([torch.ones(4), torch.full((4,), 5.0)])})
    after = algo.aggregate(server, two)
    torch.testing.assert_close(after.extra["global_mean"], torch.full((4,), (1 * 1 + 3 * 5) / 4))
    assert after.extra["known"] == 1
    again = algo.aggregate(after, Upload([0], {k: v[:1] for k, v in two.params.items()}, torch.tensor([1.0]),
                                         {"train_loss": torch.zeros(1), "running_mean": torch.zeros(1, 4)}))
    torch.testing.assert_close(again.extra["global_mean"], after.extra["global_mean"])  # fixed from then on


def test_feddbe_adds_the_clients_memory_before_the_head_and_regularises_the_running_mean():
    from hetfed.algorithms.feddbe import MEMORY

    kappa, m = 2.0, 0.1
    algo, server, state, data, x, y = _setup("feddbe", {"kappa": kappa, "momentum": m})
    g = torch.linspace(-0.5, 0.5, 4)
    server = type(server)(server.params, 1, {"global_mean": g, "known": torch.tensor(1.0)})
    memory = torch.tensor([0.2, -0.1, 0.3, 0.0])
    state = {**state, MEMORY: memory}
    upload, new = algo.local_update(algo.broadcast(server, 1), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    w = server.params
    leaves = {k: v.clone().requires_grad_(True) for k, v in w.items()}
    mem = memory.clone().requires_grad_(True)
    z = torch.relu(x @ leaves[BODY[0]] + leaves[BODY[1]])
    r = m * z.mean(0)  # the running mean after one step from 0
    loss = F.cross_entropy((z + mem) @ leaves[HEAD[0]] + leaves[HEAD[1]], y) + kappa * (0.5 * (r - g) ** 2).mean()
    grads = torch.autograd.grad(loss, [*leaves.values(), mem])
    for (k, v), gr in zip(w.items(), grads[:-1], strict=True):
        torch.testing.assert_close(upload.params[k][0], v - LR * gr)
    torch.testing.assert_close(new[MEMORY][0], memory - LR * grads[-1])
    pred = algo.predictor(algo.broadcast(server, 2), new, 1)
    held = pred.params
    z2 = torch.relu(x @ held[BODY[0]][0] + held[BODY[1]][0])
    torch.testing.assert_close(pred.model.forward(held, x.unsqueeze(0))[0],
                               (z2 + held[MEMORY][0]) @ held[HEAD[0]][0] + held[HEAD[1]][0])


# ---------------------------------------------------------------------------------------------- kNN-Per


def test_knnper_mixes_the_models_distribution_with_its_k_nearest_neighbours_in_the_clients_datastore():
    from hetfed.algorithms.knnper import KEYS, LABELS, NearestNeighbours

    algo, server, state, data, x, y = _setup("knnper")
    k, lam, scale = 3, 0.4, 2.0
    w = server.params
    z = torch.relu(x @ w[BODY[0]] + w[BODY[1]])  # the representations (d = 4)
    store = torch.randn(5, 4, generator=torch.Generator().manual_seed(2)).abs()
    store_y = torch.tensor([0, 1, 1, 0, 1])
    params = {**{n: v.unsqueeze(0) for n, v in w.items()}, KEYS: torch.cat([store, torch.zeros(2, 4)]).unsqueeze(0),
              LABELS: torch.cat([store_y, torch.tensor([-1, -1])]).unsqueeze(0)}  # two empty slots
    got = NearestNeighbours(algo.model, k, lam, scale).forward(params, x.unsqueeze(0))[0]
    for i in range(len(x)):
        d2 = ((store - z[i]) ** 2).sum(1)
        near = d2.argsort()[:k]
        sim = torch.exp(-d2[near] / (4 * scale))
        p_knn = torch.stack([(sim * (store_y[near] == c)).sum() for c in range(2)]) / sim.sum()
        p_model = torch.softmax(z[i] @ w[HEAD[0]] + w[HEAD[1]], -1)
        torch.testing.assert_close(got[i], torch.log(lam * p_knn + (1 - lam) * p_model), rtol=1e-5, atol=1e-6)


def test_knnpers_datastore_holds_the_clients_training_representations_up_to_its_capacity():
    from hetfed.engine.evaluate import ClientEvalData

    algo, server, state, data, x, y = _setup("knnper", {"capacity": 4})
    train = [np.arange(6), np.array([1, 3])]
    ev = ClientEvalData([0, 1], x, y, [np.arange(0)] * 2, [np.arange(0)] * 2, x, y, 2, None, train)
    params = {n: v.unsqueeze(0).expand(2, *v.shape) for n, v in server.params.items()}
    keys, labels = algo.datastores(params, ev)
    assert keys.shape == (2, 4, 4) and labels.shape == (2, 4)
    assert (labels[0] >= 0).all() and labels[1].tolist()[2:] == [-1, -1]  # client 1 holds two samples
    z = torch.relu(x @ server.params[BODY[0]] + server.params[BODY[1]])
    torch.testing.assert_close(keys[1, :2], z[[1, 3]])
    # client 0 holds six: four of them, the same four every time (its own stream)
    again, _ = algo.datastores(params, ev)
    assert torch.equal(keys, again)
    picked = [int(((z - row) ** 2).sum(1).argmin()) for row in keys[0]]
    assert len(set(picked)) == 4 and labels[0].tolist() == y[picked].tolist()


def test_knnper_with_no_weight_on_the_neighbours_predicts_as_fedavg():
    from hetfed.algorithms.knnper import KEYS, LABELS, NearestNeighbours

    algo, server, state, data, x, y = _setup("knnper")
    w = {n: v.unsqueeze(0) for n, v in server.params.items()}
    params = {**w, KEYS: torch.rand(1, 3, 4), LABELS: torch.tensor([[0, 1, 1]])}
    got = NearestNeighbours(algo.model, 5, 0.0, 1.0).forward(params, x.unsqueeze(0))
    torch.testing.assert_close(got, torch.log_softmax(algo.model.forward(w, x.unsqueeze(0)), -1))


# ----------------------------------------------------------------------------------------------- FedEM


def _component(server: dict, m: int) -> dict:
    return {name: server[f"fedem.{m}.{name}"] for name in (*BODY, *HEAD)}


def test_fedems_e_step_is_the_papers_responsibilities_and_its_m_step_descends_their_weighted_losses():
    """Algorithm 1: q_i(m) = π_m e^{−ℓ(θ_m; x_i, y_i)} / Σ_m' π_m' e^{−ℓ(θ_m'; x_i, y_i)}, π ← mean_i q_i; then each
    component descends (1/b) Σ_i q_i(m) ℓ(θ_m; x_i, y_i) (one full-batch SGD step here)."""
    from hetfed.algorithms.fedem import WEIGHTS

    algo, server, state, data, x, y = _setup("fedem", {"components": 2})
    pi = torch.tensor([0.3, 0.7])
    state = {**state, WEIGHTS: pi}
    upload, new = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    comps = [_component(server.params, m) for m in range(2)]
    assert not torch.equal(comps[0][BODY[0]], comps[1][BODY[0]])  # independent draws
    ell = [[F.cross_entropy(_logits(c, x[i:i + 1]), y[i:i + 1]).item() for i in range(6)] for c in comps]
    q = []
    for i in range(6):
        num = [pi[m].item() * math.exp(-ell[m][i]) for m in range(2)]
        q.append([v / sum(num) for v in num])
    q_t = torch.tensor(q)
    torch.testing.assert_close(new[WEIGHTS][0], q_t.mean(0))
    for m, c in enumerate(comps):
        leaves = {k: v.clone().requires_grad_(True) for k, v in c.items()}
        loss = (q_t[:, m] * F.cross_entropy(_logits(leaves, x), y, reduction="none")).mean()
        grads = torch.autograd.grad(loss, list(leaves.values()))
        for (k, v), g in zip(c.items(), grads, strict=True):
            torch.testing.assert_close(upload.params[f"fedem.{m}.{k}"][0], v - LR * g)


def test_a_fedem_client_predicts_with_its_mixture_of_the_components():
    from hetfed.algorithms.fedem import WEIGHTS

    algo, server, state, data, x, y = _setup("fedem", {"components": 3})
    pi = torch.tensor([0.2, 0.5, 0.3])
    pred = algo.predictor(algo.broadcast(server, 0), {WEIGHTS: pi.unsqueeze(0)}, 1)
    got = pred.model.forward(pred.params, x.unsqueeze(0))[0]
    want = sum(pi[m] * torch.softmax(_logits(_component(server.params, m), x), -1) for m in range(3))
    torch.testing.assert_close(got, torch.log(want))
    with torch.no_grad():
        assert algo.evaluate_server(server, x, y) == {}  # no single global model


# ---------------------------------------------------------------------------------------------- FedCAC


def _pfllib_critical(prev: torch.Tensor, param: torch.Tensor, tau: float) -> torch.Tensor:
    """PFLlib's clientCAC.evaluate_critical_parameter for one tensor of one client, transcribed."""
    c = torch.abs((param - prev) * param)
    metric = c.view(-1)
    nz = int(tau * metric.size(0))
    top_values, _ = torch.topk(metric, nz)
    thresh = top_values[-1] if len(top_values) > 0 else np.inf
    if thresh <= 1e-10:
        new_metric = metric[metric > 1e-20]
        if len(new_metric):
            thresh = new_metric.sort()[0][0]
    return (c >= thresh).float()


@pytest.mark.parametrize("tau", [0.0, 0.3, 0.5, 1.0])
def test_fedcacs_critical_parameters_are_the_largest_update_times_value(tau):
    from hetfed.algorithms.fedcac import critical_mask

    gen = torch.Generator().manual_seed(5)
    start = torch.randn(3, 4, 5, generator=gen)
    trained = start + 0.1 * torch.randn(3, 4, 5, generator=gen)
    trained[1] = start[1]  # a client whose update is zero: every sensitivity 0
    trained[2, :2] = start[2, :2]  # zeros among the sensitivities
    got = critical_mask(start, trained, tau)
    for k in range(3):
        assert torch.equal(got[k], _pfllib_critical(start[k], trained[k], tau)), k


def test_fedcacs_customised_models_average_the_clients_whose_critical_parameters_overlap():
    """servercac.get_customized_global_models, transcribed: o(i, j) = 1 − Σ|m_i − m_j| / (2 Σ m_i), threshold
    ō + (t + 1)/β (max − ō), each client's mean over itself and the j with o(i, j) ≥ the threshold."""
    from hetfed.algorithms.fedcac import collaborators, overlaps

    gen = torch.Generator().manual_seed(2)
    masks = (torch.rand(5, 40, generator=gen) < 0.5).float()
    masks[1] = masks[0]
    masks[1, :3] = 1 - masks[1, :3]  # client 1 nearly client 0
    counts = []
    for rnd, beta in ((0, 100.0), (30, 100.0), (3, 4.0)):
        o = overlaps(masks)
        buffer = [[1 - float(torch.sum(torch.abs(masks[i] - masks[j]))) / float(torch.sum(masks[i]) * 2)
                   for j in range(5) if j != i] for i in range(5)]
        flat = torch.tensor(buffer, dtype=torch.float64)
        threshold = flat.sum() / 20 + (rnd + 1) / beta * (flat.max() - flat.sum() / 20)
        together = collaborators(o, rnd, beta)
        for i in range(5):
            others = [j for j in range(5) if j != i]
            want = [i] + [j for idx, j in enumerate(others) if buffer[i][idx] >= threshold]
            assert sorted(torch.nonzero(together[i]).flatten().tolist()) == sorted(want)
            torch.testing.assert_close(o[i, others], flat[i])
        counts.append(int(together.sum()))
    assert counts[0] > counts[1] > counts[2] >= 6  # bold early, cautious late: at t + 1 = β only the closest pair


def test_a_fedcac_client_starts_from_its_customised_critical_and_the_global_other_parameters():
    from hetfed.algorithms.fedcac import CUSTOM, HAS_MASK, KNOWN, MASK

    algo, server, state, data, x, y = _setup("fedcac", {"tau": 0.5})
    algo.bind(type("Fed", (), {"n_clients": 3})())
    upload, new = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    assert new[HAS_MASK].tolist() == [1.0] and upload.extra["critical"].shape[1] == sum(
        v.numel() for v in server.params.values())
    up = replace_upload(upload, [2])
    after = algo.aggregate(server, up)
    assert after.extra["known"].tolist() == [0.0, 0.0, 1.0]  # the lone client's customised model is its own
    for k in (*BODY, *HEAD):
        torch.testing.assert_close(after.extra["customised"][k][2], upload.params[k][0])
    bc = algo.broadcast(after, 1).for_clients([2])
    assert set(bc.personal) == {CUSTOM + k for k in (*BODY, *HEAD)} | {KNOWN}
    states = {k: v for k, v in new.items()}
    start = algo._start(bc, states, 1)
    for k in (*BODY, *HEAD):
        m = new[MASK + k].bool()
        torch.testing.assert_close(start[k], torch.where(m, upload.params[k], after.params[k].unsqueeze(0)))


def replace_upload(upload, ids):
    from dataclasses import replace

    return replace(upload, client_ids=list(ids))


def test_what_a_server_holds_per_client_reaches_each_stack_in_its_order():
    from hetfed.engine.types import Broadcast

    table = torch.arange(5.0)[:, None].repeat(1, 2)
    bc = Broadcast({}, 0, 0.1, personal={"t": table})
    node = bc.for_clients([4, 1, 3])  # a node's clients, as the server numbers them
    assert node.personal["t"][:, 0].tolist() == [4.0, 1.0, 3.0] and node.personal_ids == (4, 1, 3)
    assert node.for_clients([3, 4]).personal["t"][:, 0].tolist() == [3.0, 4.0]  # a stack within the node
    assert Broadcast({}, 0, 0.1).for_clients([1]).personal == {}


def test_fedcacs_server_keeps_each_clients_mean_over_its_collaborators_and_averages_the_global_model():
    from hetfed.algorithms.fedcac import collaborators, overlaps
    from hetfed.engine.types import Upload

    algo, server, state, data, x, y = _setup("fedcac")
    algo.bind(type("Fed", (), {"n_clients": 6})())
    gen = torch.Generator().manual_seed(4)
    ids = [5, 0, 3, 1]
    params = {k: v + torch.randn(4, *v.shape, generator=gen) for k, v in server.params.items()}
    size = sum(v.numel() for v in server.params.values())
    masks = (torch.rand(4, size, generator=gen) < 0.5).float()
    up = Upload(ids, params, torch.tensor([1.0, 2.0, 3.0, 4.0]), {"critical": masks, "train_loss": torch.zeros(4)})
    after = algo.aggregate(server, up)
    together = collaborators(overlaps(masks), 0, algo.params.beta)
    for i, k in enumerate(ids):
        group = torch.nonzero(together[i]).flatten()
        for name, v in params.items():
            torch.testing.assert_close(after.extra["customised"][name][k], v[group].mean(0))
    assert after.extra["known"].tolist() == [1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    for name, v in params.items():  # the global model: FedAvg's sample-weighted mean
        torch.testing.assert_close(after.params[name],
                                   (v * torch.tensor([1.0, 2, 3, 4]).view(-1, *[1] * (v.dim() - 1))).sum(0) / 10)


# --------------------------------------------------------------------------------------------- FedFomo


def test_fedfomos_client_weighs_each_received_model_by_its_held_out_gain_per_distance():
    """Eq. 5: w_n = (L_i(θ_i) − L_i(θ_n)) / ‖θ_n − θ_i‖ on the client's held-out samples; it starts from
    Σ w⁺_n θ_n / Σ w⁺ and trains on the rest; the server stores its model and adds w to P[i]."""
    from hetfed.algorithms.fedfomo import SENDERS

    algo, server, state, data, x, y = _setup("fedfomo", {"models": 2})
    algo.bind(type("Fed", (), {"n_clients": 3})())
    gen = torch.Generator().manual_seed(8)
    first = server.extra["first"]
    models = {k: v.unsqueeze(0) + 0.5 * torch.randn(3, *v.shape, generator=gen) for k, v in first.items()}
    affinity = torch.tensor([[1.0, 0.2, 0.7], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]], dtype=torch.float64)
    server = type(server)({}, 4, {**server.extra, "models": models, "affinity": affinity, "uploaded": 3})
    bc = algo.broadcast(server, 4).for_clients([0])
    assert bc.personal[SENDERS][0].tolist() == [0.0, 2.0]  # the top-2 of P[0]
    upload, _ = algo.local_update(bc, {k: v.unsqueeze(0) for k, v in state.items()}, data)
    mine = {k: v[0] for k, v in models.items()}
    held, rest = slice(5, 6), slice(0, 5)  # int(0.2 · 6) = 1 held out: the last sample

    def loss(p):
        return F.cross_entropy(_logits(p, x[held]), y[held]).item()

    w = []
    for j in (0, 2):
        theirs = {k: v[j] for k, v in models.items()}
        distance = math.sqrt(sum(float(((theirs[k] - mine[k]) ** 2).sum()) for k in mine))
        w.append((loss(mine) - loss(theirs)) / (distance + 1e-5))
    torch.testing.assert_close(upload.extra["fomo_weights"][0], torch.tensor(w, dtype=torch.float32))
    positive = [max(v, 0.0) for v in w]
    if sum(positive) > 0:
        start = {k: sum(p / sum(positive) * models[k][j] for p, j in zip(positive, (0, 2), strict=True)) for k in mine}
    else:
        start = mine
    leaves = {k: v.clone().requires_grad_(True) for k, v in start.items()}
    grads = torch.autograd.grad(F.cross_entropy(_logits(leaves, x[rest]), y[rest]), list(leaves.values()))
    for (k, v), g in zip(start.items(), grads, strict=True):
        torch.testing.assert_close(upload.params[k][0], v - LR * g)
    after = algo.aggregate(server, upload)
    for k in mine:
        torch.testing.assert_close(after.extra["models"][k][0], upload.params[k][0])
        torch.testing.assert_close(after.extra["models"][k][1], models[k][1])
    want = affinity.clone()
    want[0, 0] += w[0]
    want[0, 2] += w[1]
    torch.testing.assert_close(after.extra["affinity"], want)


def test_fedfomo_sends_no_model_before_anyone_uploaded_and_a_client_then_trains_its_first_draw():
    from hetfed.algorithms.fedfomo import OWN, SENDERS

    algo, server, state, data, x, y = _setup("fedfomo")
    algo.bind(type("Fed", (), {"n_clients": 2})())
    bc = algo.broadcast(server, 0).for_clients([1])
    assert bc.personal[SENDERS].shape == (1, 0)
    for k, v in server.extra["first"].items():
        assert torch.equal(bc.personal[OWN + k][0], v)


# ---------------------------------------------------------------------------------------------- pFedHN


def test_pfedhns_server_step_is_the_authors_hypernetwork_update():
    """AvivSham/pFedHN trainer.py with a CNNHyper-shaped MLP hypernetwork written with torch.nn: the client trains
    the generated model; the server sets φ's gradient to the VJP of the generated weights with (generated −
    trained), clips it to norm 50 and steps SGD(lr, momentum 0.9, weight decay 1e-3)."""
    from torch import nn

    from hetfed.algorithms.pfedhn import GENERATED
    from hetfed.engine.rng import SERVER_INIT, torch_gen

    algo, _, state, data, x, y = _setup("pfedhn", {"hidden": 5, "layers": 1, "embedding": 3})
    algo.bind(type("Fed", (), {"n_clients": 3})())
    server = algo.server_init(torch_gen(7, SERVER_INIT))
    phi = server.extra["hypernetwork"]
    names = {**{k: (3, 4) if k == BODY[0] else (4,) for k in BODY}, HEAD[0]: (4, 2), HEAD[1]: (2,)}

    class Hyper(nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings = nn.Embedding(3, 3)
            self.mlp = nn.Sequential(nn.Linear(3, 5), nn.ReLU(inplace=True), nn.Linear(5, 5))
            self.heads = nn.ModuleDict({k.replace(".", "_"): nn.Linear(5, math.prod(s)) for k, s in names.items()})

        def forward(self, idx):
            features = self.mlp(self.embeddings(idx))
            return {k: self.heads[k.replace(".", "_")](features).view(s) for k, s in names.items()}

    hnet = Hyper()
    with torch.no_grad():
        hnet.embeddings.weight.copy_(phi["embeddings"])
        for j, layer in ((0, hnet.mlp[0]), (1, hnet.mlp[2])):
            layer.weight.copy_(phi[f"mlp.{j}.weight"])
            layer.bias.copy_(phi[f"mlp.{j}.bias"])
        for k in names:
            hnet.heads[k.replace(".", "_")].weight.copy_(phi[f"head.{k}.weight"])
            hnet.heads[k.replace(".", "_")].bias.copy_(phi[f"head.{k}.bias"])
    weights = hnet(torch.tensor([0]))
    bc = algo.broadcast(server, 0).for_clients([0])
    for k, w in weights.items():
        torch.testing.assert_close(bc.personal[GENERATED + k][0], w.detach())
    upload, _ = algo.local_update(bc, {k: v.unsqueeze(0) for k, v in state.items()}, data)
    trained = _sgd({k: w.detach() for k, w in weights.items()}, list(names), x, y)  # one full-batch step
    for k in names:
        torch.testing.assert_close(upload.params[k][0], trained[k])
    after = algo.aggregate(server, upload).extra["hypernetwork"]
    optimizer = torch.optim.SGD(hnet.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-3)
    optimizer.zero_grad()
    delta = [weights[k].detach() - upload.params[k][0] for k in names]
    grads = torch.autograd.grad(list(weights.values()), hnet.parameters(), grad_outputs=delta, allow_unused=True)
    for p, g in zip(hnet.parameters(), grads, strict=True):
        p.grad = torch.zeros_like(p) if g is None else g
    torch.nn.utils.clip_grad_norm_(hnet.parameters(), 50)
    optimizer.step()
    torch.testing.assert_close(after["embeddings"], hnet.embeddings.weight.detach())
    torch.testing.assert_close(after["mlp.1.weight"], hnet.mlp[2].weight.detach())
    for k in names:
        torch.testing.assert_close(after[f"head.{k}.weight"], hnet.heads[k.replace(".", "_")].weight.detach())
    torch.testing.assert_close(after["embeddings"][1], phi["embeddings"][1] * (1 - 0.01 * 1e-3))  # decay only


def test_pfedhns_servers_stepped_as_one_stack_give_each_runs_hypernetwork_as_alone():
    """#74 §1: a stacked sweep's pFedHN servers step their hypernetworks together (``aggregate_runs``): each run's
    φ and momentum after two rounds of three clients (each run its own clients, each update clipped to its own run's
    norm) are the run's alone, to the bit."""
    from hetfed.algorithms.pfedhn import GENERATED
    from hetfed.engine.rng import SERVER_INIT, torch_gen
    from hetfed.engine.types import Upload

    algos, servers = [], []
    for seed in (0, 1, 2):
        algo = _setup("pfedhn", {"hidden": 5, "layers": 1, "embedding": 3, "clip": 0.05})[0]  # clipping every step
        algo.bind(type("Fed", (), {"n_clients": 5})())
        algos.append(algo)
        servers.append(algo.server_init(torch_gen(seed, SERVER_INIT)))
    alone, together = list(servers), list(servers)
    for rnd in range(2):
        uploads = []
        for r, (algo, server) in enumerate(zip(algos, alone, strict=True)):
            ids = [(r + rnd + j) % 5 for j in range(3)]
            bc = algo.broadcast(server, rnd).for_clients(ids)
            g = torch.Generator().manual_seed(10 * r + rnd)
            params = {k[len(GENERATED):]: v + 0.1 * torch.randn(v.shape, generator=g)
                      for k, v in bc.personal.items()}
            uploads.append(Upload(ids, params, torch.ones(3), {}))
        assert len({a.aggregate_key(s, u) for a, s, u in zip(algos, together, uploads, strict=True)}) == 1
        alone = [a.aggregate(s, u) for a, s, u in zip(algos, alone, uploads, strict=True)]
        together = type(algos[0]).aggregate_runs(algos, together, uploads)
    for a, b in zip(alone, together, strict=True):
        for part in ("hypernetwork", "momentum"):
            assert a.extra[part].keys() == b.extra[part].keys()
            for k in a.extra[part]:
                assert torch.equal(a.extra[part][k], b.extra[part][k]), (part, k)
    assert not torch.equal(alone[0].extra["hypernetwork"]["embeddings"], alone[1].extra["hypernetwork"]["embeddings"])


# ----------------------------------------------------------------------------------------------- FedAS


def test_fedas_aligns_the_global_body_to_its_prototypes_trains_and_reports_its_fisher_trace():
    """clientas.set_parameters: prototypes from the client's own model, one SGD pass (lr 0.01) of Σ_c MSE(z_c, p_c)
    on the global body; train with its own head; Σ_batches Σ_θ ‖∇ NLL‖² of the trained model (one batch here)."""
    from hetfed.algorithms.fedas import PREVIOUS

    algo, server, state, data, x, y = _setup("fedas")
    gen = torch.Generator().manual_seed(6)
    own_body = {k: server.params[k] + 0.3 * torch.randn(server.params[k].shape, generator=gen) for k in BODY}
    state = {**state, **{PREVIOUS + k: v for k, v in own_body.items()}}
    upload, new = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    head = {k: state[k] for k in HEAD}
    z_own = torch.relu(x @ own_body[BODY[0]] + own_body[BODY[1]])
    protos = {c: z_own[y == c].mean(0) for c in (0, 1)}
    leaves = {k: server.params[k].clone().requires_grad_(True) for k in BODY}
    z = torch.relu(x @ leaves[BODY[0]] + leaves[BODY[1]])
    loss = sum(torch.nn.MSELoss()(z[y == c], protos[c].expand_as(z[y == c])) for c in (0, 1))  # PFLlib broadcasts
    grads = torch.autograd.grad(loss, list(leaves.values()))
    aligned = {k: (leaves[k] - 0.01 * g).detach() for (k, _), g in zip(leaves.items(), grads, strict=True)}
    trained = _sgd({**aligned, **head}, [*BODY, *HEAD], x, y)
    for k in BODY:
        torch.testing.assert_close(upload.params[k][0], trained[k])
        torch.testing.assert_close(new[PREVIOUS + k][0], trained[k])
    for k in HEAD:
        torch.testing.assert_close(new[k][0], trained[k])
    leaves = {k: v.clone().requires_grad_(True) for k, v in trained.items()}
    nll = -torch.log_softmax(_logits(leaves, x), 1)[range(6), y].mean()
    trace = sum(float((g ** 2).sum()) for g in torch.autograd.grad(nll, list(leaves.values())))
    assert upload.extra["fisher_trace"][0].item() == pytest.approx(trace, rel=1e-5)


def test_fedas_fisher_trace_of_unequal_clients_is_each_clients_own():
    """The trace of a stack of clients with 0 to 3 batches (taken most batches first, each pass computing only the
    clients that still have a batch) is each client's trace computed alone, in the stack's order."""
    from hetfed.algorithms.fedas import fisher_trace
    from hetfed.config import ModelConfig
    from hetfed.engine.types import ClientData
    from hetfed.models import build_model

    model = build_model(ModelConfig(kind="mlp", hidden=[4]), (3,), 2)
    gen = torch.Generator().manual_seed(3)
    x, y = torch.randn(20, 3, generator=gen), torch.randint(0, 2, (20,), generator=gen)
    indices = [np.arange(0, 2), np.arange(2, 2), np.arange(2, 11), np.arange(11, 16), np.arange(16, 20)]
    n = len(indices)
    stacked = {s.name: torch.stack([s.init(gen, s.shape) for _ in range(n)]) for s in model.specs()}
    together = fisher_trace(model, stacked, ClientData(list(range(n)), x, y, indices, list(range(n))), batch=4)
    alone = [fisher_trace(model, {k: v[k_:k_ + 1] for k, v in stacked.items()},
                          ClientData([k_], x, y, [indices[k_]], [k_]), batch=4) for k_ in range(n)]
    assert together[1] == 0 and (together[[0, 2, 3, 4]] > 0).all()
    torch.testing.assert_close(together, torch.cat(alone), rtol=1e-6, atol=0)


def test_fedas_averages_the_bodies_weighted_by_fisher_trace():
    from hetfed.engine.types import Upload

    algo, server, _, _, _, _ = _setup("fedas")
    gen = torch.Generator().manual_seed(1)
    params = {k: torch.randn(3, *server.params[k].shape, generator=gen) for k in BODY}
    trace = torch.tensor([1.0, 3.0, 0.0])
    after = algo.aggregate(server, Upload([0, 1, 2], params, torch.tensor([5.0, 5.0, 90.0]),
                                          {"fisher_trace": trace, "train_loss": torch.zeros(3)}))
    for k in BODY:
        torch.testing.assert_close(after.params[k], 0.25 * params[k][0] + 0.75 * params[k][1])


# ---------------------------------------------------------------------------------------------- FedPAC


def _pfllib_statistics(z: torch.Tensor, y: torch.Tensor, n_classes: int):
    """clientpac.statistics_extraction, transcribed (features and labels given)."""
    feature_dict = {}
    for i in range(len(y)):
        feature_dict.setdefault(int(y[i]), []).append(z[i])
    py = torch.zeros(n_classes)
    for yy in y:
        py[int(yy)] += 1
    py = py / torch.sum(py)
    py2 = py.mul(py)
    v = 0.0
    h_ref = torch.zeros((n_classes, z.shape[1]))
    for k in range(n_classes):
        if k in feature_dict:
            feat_k = torch.stack(feature_dict[k])
            feat_k_mu = feat_k.mean(dim=0)
            h_ref[k] = py[k] * feat_k_mu
            v += (py[k] * torch.trace(torch.mm(torch.t(feat_k), feat_k) / feat_k.shape[0])).item()
            v -= (py2[k] * (torch.mul(feat_k_mu, feat_k_mu))).sum().item()
    return h_ref, v / len(y)


def test_fedpacs_feature_statistics_are_pfllibs():
    from hetfed.algorithms.fedpac import feature_statistics

    gen = torch.Generator().manual_seed(3)
    z = torch.randn(11, 4, generator=gen)
    y = torch.tensor([0, 2, 2, 1, 0, 2, 2, 0, 1, 2, 2])
    h, v = feature_statistics(z, y, 4)
    want_h, want_v = _pfllib_statistics(z, y, 4)
    torch.testing.assert_close(h.float(), want_h)
    assert v == pytest.approx(want_v, rel=1e-6)


def test_fedpacs_combination_weights_solve_the_papers_quadratic_program():
    """min αᵀ(diag(V) + D_i)α on the simplex, D_i[j, l] = Σ_k ⟨h_i,k − h_j,k, h_i,k − h_l,k⟩: no point of a fine
    grid over the simplex does better, and weights below 1e-3 are zeroed."""
    from hetfed.algorithms.fedpac import combination_weights

    gen = torch.Generator().manual_seed(9)
    h = torch.randn(3, 2, 4, generator=gen, dtype=torch.float64)
    h[1] = h[0] + 0.05 * torch.randn(2, 4, generator=gen, dtype=torch.float64)  # client 1 looks like client 0
    v = torch.tensor([0.5, 0.4, 0.3], dtype=torch.float64)
    for i in range(3):
        p = np.diag(v.numpy()) + np.array([[float(sum((h[i, k] - h[j, k]) @ (h[i, k] - h[m, k]) for k in range(2)))
                                            for m in range(3)] for j in range(3)])
        alpha = combination_weights(i, v, h)
        best = min(float(a @ p @ a) for a in (np.array([x, yy, 1 - x - yy]) for x in np.linspace(0, 1, 101)
                                                for yy in np.linspace(0, 1, 101) if x + yy <= 1))
        assert float(alpha @ p @ alpha) <= best + 1e-6 and abs(alpha.sum() - 1) < 1e-3
        assert all(a == 0 or a > 1e-3 for a in alpha)
    assert combination_weights(0, v, h)[2] < combination_weights(0, v, h)[1]  # the look-alike weighs more


def test_a_fedpac_client_trains_its_head_then_its_body_aligned_to_the_global_centroids():
    algo, server, state, data, x, y = _setup("fedpac", {"lam": 0.5})
    centroids = torch.tensor([[0.5, -0.2, 0.1, 0.3], [0.0, 0.0, 0.0, 0.0]])
    server = type(server)(server.params, 0, {"centroids": centroids, "known": torch.tensor([1.0, 0.0])})
    upload, new = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    start = {**server.params, **{k: state[k] for k in HEAD}}
    after_head = _sgd(start, list(HEAD), x, y)  # one pass on the head, the body frozen

    def align(p):
        z = torch.relu(x @ p[BODY[0]] + p[BODY[1]])
        target = torch.where((y == 0)[:, None], centroids[y], z.detach())  # class 1 has no global centroid
        return 0.5 * ((z - target) ** 2).mean()

    trained = _sgd(after_head, list(BODY), x, y, extra=align)
    for k in BODY:
        torch.testing.assert_close(upload.params[k][0], trained[k])
    for k in HEAD:
        torch.testing.assert_close(new[k][0], trained[k])
    torch.testing.assert_close(upload.extra["head"][0], torch.cat([trained[k].reshape(-1) for k in HEAD]))


def test_fedpacs_server_averages_centroids_over_the_clients_with_the_class_and_combines_each_clients_head():
    from hetfed.algorithms.fedpac import HEAD as PAC
    from hetfed.algorithms.fedpac import KNOWN, combination_weights
    from hetfed.engine.types import Upload

    algo, server, _, _, _, _ = _setup("fedpac")
    algo.bind(type("Fed", (), {"n_clients": 5})())
    server = algo.server_init(torch.Generator().manual_seed(0))
    gen = torch.Generator().manual_seed(2)
    heads = {k: torch.randn(3, *s, generator=gen) for k, s in ((HEAD[0], (4, 2)), (HEAD[1], (2,)))}
    body = {k: torch.randn(3, *server.params[k].shape, generator=gen) for k in BODY}
    cents = torch.randn(3, 2, 4, generator=gen)
    counts = torch.tensor([[3.0, 0.0], [1.0, 2.0], [0.0, 4.0]])
    h, v = torch.randn(3, 2, 4, generator=gen), torch.tensor([0.2, 0.3, 0.1])
    up = Upload([4, 0, 2], body, torch.ones(3), {"centroids": cents, "label_counts": counts, "pac_h": h, "pac_v": v,
                                                 "train_loss": torch.zeros(3),
                                                 "head": torch.cat([t.reshape(3, -1) for t in heads.values()], 1)})
    after = algo.aggregate(server, up)
    torch.testing.assert_close(after.extra["centroids"][0], (cents[0, 0] + cents[1, 0]) / 2)
    torch.testing.assert_close(after.extra["centroids"][1], (cents[1, 1] + cents[2, 1]) / 2)
    for i, cid in enumerate([4, 0, 2]):
        alpha = torch.as_tensor(combination_weights(i, v, h), dtype=torch.float32)
        for k, t in heads.items():
            torch.testing.assert_close(after.extra["heads"][k][cid], torch.tensordot(alpha, t, dims=1))
    bc = algo.broadcast(after, 1).for_clients([2, 3])
    assert bc.personal[KNOWN].tolist() == [1.0, 0.0] and set(bc.personal) == {PAC + k for k in heads} | {KNOWN}


# ------------------------------------------------------------------------------------------------ GPFL


def test_gpfls_step_is_pfllibs_with_its_category_embeddings_and_conditional_valve():
    """clientGPFL.train for one full-batch step, written with PFLlib's GCE and CoV modules (torch.nn): CE of the
    head on CoV(z, p) + GCE's angle softmax on CoV(z, g) + λ‖CoV(z, g) − ē_y‖; SGD on the model, SGD with weight
    decay μ on GCE and CoV."""
    from torch import nn

    from hetfed.algorithms.gpfl import COV, GCE

    lam, mu = 0.5, 0.1
    algo, server, state, data, x, y = _setup("gpfl", {"lam": lam, "mu": mu})
    upload, new = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    w = server.params
    d, n_classes = 4, 2

    class CoV(nn.Module):  # servergpfl.CoV
        def __init__(self):
            super().__init__()
            self.Conditional_gamma = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.LayerNorm([d]))
            self.Conditional_beta = nn.Sequential(nn.Linear(d, d), nn.ReLU(), nn.LayerNorm([d]))
            self.act = nn.ReLU()

        def forward(self, x, context):
            out = torch.multiply(x, self.Conditional_gamma(context) + 1)
            return self.act(torch.add(out, self.Conditional_beta(context)))

    cov = CoV()
    embedding = nn.Embedding(n_classes, d)
    with torch.no_grad():
        embedding.weight.copy_(w[GCE])
        for branch, seq in (("gamma", cov.Conditional_gamma), ("beta", cov.Conditional_beta)):
            seq[0].weight.copy_(w[f"{COV}{branch}.weight"])
            seq[0].bias.copy_(w[f"{COV}{branch}.bias"])
            seq[2].weight.copy_(w[f"{COV}{branch}.norm_weight"])
            seq[2].bias.copy_(w[f"{COV}{branch}.norm_bias"])
    frozen = w[GCE].clone()
    prior = torch.tensor([0.5, 0.5])  # y holds three of each class
    generic = frozen.mean(0, keepdim=True)
    personal = (frozen * prior[:, None]).sum(0, keepdim=True)
    model = {k: (w[k] if k in BODY else state[k]).clone().requires_grad_(True) for k in (*BODY, *HEAD)}
    feat = torch.relu(x @ model[BODY[0]] + model[BODY[1]])
    output = cov(feat, personal) @ model[HEAD[0]] + model[HEAD[1]]
    feat_g = cov(feat, generic)
    embeddings = embedding(torch.arange(n_classes))
    cosine = F.linear(F.normalize(feat_g), F.normalize(embeddings))
    softmax_loss = -torch.mean(torch.sum(F.one_hot(y, n_classes) * F.log_softmax(cosine, dim=1), dim=1))
    loss = F.cross_entropy(output, y) + softmax_loss + torch.norm(feat_g - frozen[y], 2) * lam
    loss.backward()
    for k in BODY:
        torch.testing.assert_close(upload.params[k][0], (model[k] - LR * model[k].grad).detach())
    for k in HEAD:
        torch.testing.assert_close(new[k][0], (model[k] - LR * model[k].grad).detach())
    torch.testing.assert_close(upload.params[GCE][0],
                               embedding.weight - LR * (embedding.weight.grad + mu * embedding.weight))
    for branch, seq in (("gamma", cov.Conditional_gamma), ("beta", cov.Conditional_beta)):
        lin, norm = seq[0], seq[2]
        for name, p in ((f"{COV}{branch}.weight", lin.weight), (f"{COV}{branch}.bias", lin.bias),
                        (f"{COV}{branch}.norm_weight", norm.weight), (f"{COV}{branch}.norm_bias", norm.bias)):
            torch.testing.assert_close(upload.params[name][0], (p - LR * (p.grad + mu * p)).detach())


# ----------------------------------------------------------------------------------------------- FedCP


def _pfllib_mmd(x, y):
    """clientcp.MMD(x, y, 'rbf'), transcribed."""
    xx, yy, zz = torch.mm(x, x.t()), torch.mm(y, y.t()), torch.mm(x, y.t())
    rx = (xx.diag().unsqueeze(0).expand_as(xx))
    ry = (yy.diag().unsqueeze(0).expand_as(yy))
    dxx, dyy, dxy = rx.t() + rx - 2. * xx, ry.t() + ry - 2. * yy, rx.t() + ry - 2. * zz
    XX, YY, XY = torch.zeros(xx.shape), torch.zeros(xx.shape), torch.zeros(xx.shape)
    for a in [10, 15, 20, 50]:
        XX += torch.exp(-0.5 * dxx / a)
        YY += torch.exp(-0.5 * dyy / a)
        XY += torch.exp(-0.5 * dxy / a)
    return torch.mean(XX + YY - 2. * XY)


def test_fedcps_step_is_pfllibs_conditional_policy_with_the_same_gumbel_draws():
    """clientCP.train_cs_model for one full-batch step: rep, gate input rep ⊙ normalised context, CS (Linear,
    LayerNorm, ReLU) and a Gumbel softmax over each feature's two entries, head_p(rep ⊙ p) + head_g(rep ⊙ g),
    CE + λ·MMD(rep, frozen base's rep); then the uploaded global head ½(head_p + head_g) and the new context."""
    from torch import nn

    from hetfed import streams
    from hetfed.algorithms.fedcp import CONTEXT, CS, HEAD_G
    from hetfed.engine.step_plan import plan_batches
    from hetfed.models.base import Noise

    lam = 0.7
    algo, server, state, data, x, y = _setup("fedcp", {"lam": lam})
    upload, new = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    order = torch.as_tensor(plan_batches(6, algo.schedule, 123)[0])
    xb, yb = x[order], y[order]
    u = Noise(streams.keys([123], "cpu"), 0, [6]).uniforms(6, 8)[0]  # the step's first (and only) draw
    w = server.params
    d = 4
    fc = nn.Sequential(nn.Linear(d, 2 * d), nn.LayerNorm([2 * d]), nn.ReLU())
    with torch.no_grad():
        fc[0].weight.copy_(w[CS + "weight"])
        fc[0].bias.copy_(w[CS + "bias"])
        fc[1].weight.copy_(w[CS + "norm_weight"])
        fc[1].bias.copy_(w[CS + "norm_bias"])
    model = {k: (w[k] if k in BODY else state[k]).clone().requires_grad_(True) for k in (*BODY, *HEAD)}
    rep = torch.relu(xb @ model[BODY[0]] + model[BODY[1]])
    rep_base = torch.relu(xb @ w[BODY[0]] + w[BODY[1]])
    context = F.normalize(state[CONTEXT].unsqueeze(0), p=2, dim=1)
    h = fc(rep * context).view(6, 2, -1)
    gumbels = -torch.log(-torch.log(u)).view(6, 2, -1)
    shares = torch.softmax(h + gumbels, dim=1)  # F.gumbel_softmax(h, dim=1, tau=1) with these draws
    p, g = shares[:, 0, :], shares[:, 1, :]
    out = (rep * p) @ model[HEAD[0]] + model[HEAD[1]] + (rep * g) @ w[HEAD_G + HEAD[0]] + w[HEAD_G + HEAD[1]]
    loss = F.cross_entropy(out, yb) + _pfllib_mmd(rep, rep_base) * lam
    loss.backward()
    for k in BODY:
        torch.testing.assert_close(upload.params[k][0], (model[k] - LR * model[k].grad).detach())
    head_p = {k: (model[k] - LR * model[k].grad).detach() for k in HEAD}
    for k in HEAD:
        torch.testing.assert_close(new[k][0], head_p[k])
        torch.testing.assert_close(upload.params[HEAD_G + k][0], 0.5 * head_p[k] + 0.5 * w[HEAD_G + k])
    torch.testing.assert_close(upload.params[CS + "weight"][0], (fc[0].weight - LR * fc[0].weight.grad).detach())
    torch.testing.assert_close(new[CONTEXT][0], head_p[HEAD[0]].sum(1))  # W is [d, C] here: summed over classes


# ---------------------------------------------------------------------------------------------- pFedLA


def test_pfedlas_layer_wise_aggregate_and_hypernetwork_step_are_fl_benchs_with_the_descent_sign():
    """FL-bench's HyperNetwork (torch.nn) and get_client_model_params: α^l = ReLU(fc_l(MLP(emb_i))), θ̄^l = Σ_j
    α^l[j]/Σα^l θ_j^l; after training, SGD on the hypernetwork with the VJP of θ̄ along θ̄ − θ̃ (FL-bench passes
    −(θ̄ − θ̃): see the module's docstring) and θ_i ← θ_i − (θ̄ − θ̃)."""
    from torch import nn

    from hetfed.algorithms.pfedla import AGGREGATE
    from hetfed.engine.rng import SERVER_INIT, torch_gen

    algo, _, state, data, x, y = _setup("pfedla", {"hidden": 5, "embedding": 3})
    algo.bind(type("Fed", (), {"n_clients": 3})())
    server = algo.server_init(torch_gen(7, SERVER_INIT))
    gen = torch.Generator().manual_seed(4)
    layers = [*BODY, *HEAD]
    personal = {k: torch.randn(3, *v.shape[1:], generator=gen) for k, v in server.extra["personal"].items()}
    server = type(server)({}, 0, {**server.extra, "personal": personal})
    phi = {k: v[0] for k, v in server.extra["hypernetworks"].items()}  # client 0's hypernetwork

    class HyperNetwork(nn.Module):  # FL-bench's, k = 0
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(3, 3)
            self.mlp = nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 5), nn.ReLU(), nn.Linear(5, 5), nn.ReLU())
            self.fc_layers = nn.ModuleList(nn.Linear(5, 3) for _ in layers)

        def forward(self, client_id):
            feature = self.mlp(self.embedding(torch.tensor(client_id, dtype=torch.long)))
            return [F.relu(fc(feature)) for fc in self.fc_layers]

    hnet = HyperNetwork()
    with torch.no_grad():
        hnet.embedding.weight.copy_(phi["embeddings"])
        for j, m in enumerate((hnet.mlp[0], hnet.mlp[2], hnet.mlp[4])):
            m.weight.copy_(phi[f"mlp.{j}.weight"])
            m.bias.copy_(phi[f"mlp.{j}.bias"])
        for name, fc in zip(layers, hnet.fc_layers, strict=True):
            fc.weight.copy_(phi[f"out.{name}.weight"])
            fc.bias.copy_(phi[f"out.{name}.bias"])
    alpha = hnet(0)
    aggregated = {name: torch.sum((a / a.sum()) * torch.stack([personal[name][j] for j in range(3)], dim=-1), dim=-1)
                  for name, a in zip(layers, alpha, strict=True)}
    bc = algo.broadcast(server, 0).for_clients([0])
    for k in layers:
        torch.testing.assert_close(bc.personal[AGGREGATE + k][0], aggregated[k].detach())
    upload, _ = algo.local_update(bc, {k: v.unsqueeze(0) for k, v in state.items()}, data)
    after = algo.aggregate(server, upload)
    diff = [aggregated[k].detach() - upload.params[k][0] for k in layers]
    optimizer = torch.optim.SGD(hnet.parameters(), lr=5e-3, momentum=0.0)
    grads = torch.autograd.grad(list(aggregated.values()), list(hnet.parameters()), grad_outputs=diff,
                                allow_unused=True)
    for p, g in zip(hnet.parameters(), grads, strict=True):
        p.grad = torch.zeros_like(p) if g is None else g
    optimizer.step()
    got = {k: v[0] for k, v in after.extra["hypernetworks"].items()}
    torch.testing.assert_close(got["embeddings"], hnet.embedding.weight.detach())
    torch.testing.assert_close(got["mlp.2.weight"], hnet.mlp[4].weight.detach())
    for name, fc in zip(layers, hnet.fc_layers, strict=True):
        torch.testing.assert_close(got[f"out.{name}.weight"], fc.weight.detach())
    for k, d in zip(layers, diff, strict=True):
        torch.testing.assert_close(after.extra["personal"][k][0], personal[k][0] - d)
        torch.testing.assert_close(after.extra["personal"][k][1], personal[k][1])  # others untouched


def test_a_saved_run_of_a_method_whose_server_keeps_a_row_per_client_predicts_per_client_from_its_rows(tmp_path):
    """The run saves each client's row beside the model; one saved without them (before hetfed kept them) refuses
    client predictions in one line naming the file."""
    from hetfed.api import Run
    from hetfed.cli import main
    from hetfed.errors import ConfigError

    assert main(["run", "--quiet", "--out", str(tmp_path / "r"), "--set", "train.rounds=1", "--set",
                 "methods=[{name: fedcac, algorithm: fedcac}]"]) == 0
    x = np.zeros((2, 64), dtype=np.float32)
    assert Run(tmp_path / "r").model("fedcac").predict(x, client=0).shape == (2,)
    (tmp_path / "r" / "checkpoints" / "fedcac-best-served.pt").unlink()
    with pytest.raises(ConfigError, match=r"keeps a row per client .* \(checkpoints/<model>-served.pt\) lack"):
        Run(tmp_path / "r").model("fedcac").predict(x, client=0)


def test_a_saved_fedproto_run_classifies_by_its_saved_prototypes_or_says_it_lacks_them(tmp_path):
    from hetfed.api import Run
    from hetfed.cli import main
    from hetfed.errors import ConfigError

    assert main(["run", "--quiet", "--out", str(tmp_path / "r"), "--set", "train.rounds=1", "--set",
                 "methods=[{name: fedproto, algorithm: fedproto}]"]) == 0
    x = np.zeros((2, 64), dtype=np.float32)
    assert Run(tmp_path / "r").model("fedproto").predict(x, client=0).shape == (2,)
    (tmp_path / "r" / "checkpoints" / "fedproto-best-served.pt").unlink()
    with pytest.raises(ConfigError, match="global prototypes, which runs written before hetfed saved them"):
        Run(tmp_path / "r").model("fedproto").predict(x, client=0)



def test_pfedlas_clients_stepped_at_once_are_its_clients_in_turn_and_runs_stacked_are_each_run_alone():
    """#74 §1: pFedLA's server steps a round's clients at once (a client's step reads only its own hypernetwork and
    the round's personal models: FL-bench's loop over them gives the same), and a stacked sweep's runs in one call
    (``aggregate_runs``), each run's hypernetworks and personal models as alone, to the bit, over two rounds."""
    from hetfed.algorithms.pfedla import AGGREGATE
    from hetfed.engine.rng import SERVER_INIT, torch_gen
    from hetfed.engine.types import Upload

    algos, servers = [], []
    for seed in (0, 1, 2):
        algo = _setup("pfedla", {"hidden": 5, "embedding": 3})[0]
        algo.bind(type("Fed", (), {"n_clients": 5})())
        algos.append(algo)
        servers.append(algo.server_init(torch_gen(seed, SERVER_INIT)))

    def uploads_of(states, rnd):
        out = []
        for r, (algo, server) in enumerate(zip(algos, states, strict=True)):
            ids = [(r + rnd + j) % 5 for j in range(3)]
            bc = algo.broadcast(server, rnd).for_clients(ids)
            g = torch.Generator().manual_seed(10 * r + rnd)
            out.append(Upload(ids, {k[len(AGGREGATE):]: v + 0.1 * torch.randn(v.shape, generator=g)
                                    for k, v in bc.personal.items()}, torch.ones(3), {}))
        return out

    alone, together = list(servers), list(servers)
    for rnd in range(2):
        uploads = uploads_of(alone, rnd)
        if rnd == 0:  # the clients at once are the clients in turn (each alone in a round of its own)
            one_by_one = [algos[0].aggregate(servers[0], Upload([c], {k: v[i:i + 1] for k, v in
                                                                      uploads[0].params.items()}, torch.ones(1), {}))
                          for i, c in enumerate(uploads[0].client_ids)]
            at_once = algos[0].aggregate(servers[0], uploads[0])
            for i, c in enumerate(uploads[0].client_ids):
                for part in ("hypernetworks", "personal"):
                    for k, v in at_once.extra[part].items():
                        torch.testing.assert_close(v[c], one_by_one[i].extra[part][k][c], rtol=1e-6, atol=1e-7)
        assert len({a.aggregate_key(s, u) for a, s, u in zip(algos, together, uploads, strict=True)}) == 1
        alone = [a.aggregate(s, u) for a, s, u in zip(algos, alone, uploads, strict=True)]
        together = type(algos[0]).aggregate_runs(algos, together, uploads)
    for a, b in zip(alone, together, strict=True):
        for part in ("hypernetworks", "personal"):
            for k in a.extra[part]:
                assert torch.equal(a.extra[part][k], b.extra[part][k]), (part, k)
    for part in ("hypernetworks", "personal"):  # each run's own tensors: a checkpoint saves its run's rows only
        assert all(v.untyped_storage().nbytes() == v.numel() * v.element_size()
                   for v in together[1].extra[part].values())
    untouched = 4  # run 0 trained clients 0-2 then 1-3: client 4's rows never move
    assert torch.equal(alone[0].extra["personal"][BODY[0]][untouched], servers[0].extra["personal"][BODY[0]][untouched])

# --------------------------------------------------------------------------------------------- pFedFDA


def test_pfedfdas_lda_head_is_the_gaussian_posterior_with_the_clients_priors():
    """logit_c(z) = log N(z; μ_c, Σ̃) + log π_c up to one constant per sample: the softmax is the Bayes posterior of
    class-conditional Gaussians with the shrunk shared covariance Σ̃ = (1 − ε)Σ + ε·tr(Σ)/d·I (the paper's
    generative classifier; the authors' ``lda_classify``)."""
    from hetfed.algorithms.pfedfda import lda_head

    gen = torch.Generator().manual_seed(3)
    d, c, eps = 4, 3, 0.05
    means = torch.randn(c, d, generator=gen, dtype=torch.float64)
    a = torch.randn(d, d, generator=gen, dtype=torch.float64)
    cov = a @ a.T + 0.5 * torch.eye(d, dtype=torch.float64)
    priors = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    z = torch.randn(7, d, generator=gen, dtype=torch.float64)
    coef, bias = lda_head(means, cov, priors, eps)
    shrunk = (1 - eps) * cov + eps * torch.trace(cov) / d * torch.eye(d, dtype=torch.float64)
    log_joint = torch.stack([torch.distributions.MultivariateNormal(means[k], shrunk).log_prob(z) for k in range(c)],
                            1) + priors.log()
    torch.testing.assert_close(torch.softmax(z @ coef.T + bias, 1), torch.softmax(log_joint, 1))



@pytest.mark.parametrize("d", [4, 64, 512])
def test_pfedfdas_heads_solved_per_client_are_the_head_solved_once(d: int):
    """A stacked sweep's clients read the server's statistics as their own run's rows (``[n, C, d]``, ``[n, d, d]``);
    one run's rows give each client the head one solve for all gives it, to the bit: the one-by-one sweep's."""
    from hetfed.algorithms.pfedfda import lda_head

    gen = torch.Generator().manual_seed(d)
    n, c = 6, 10
    a = torch.randn(d, d + 3, generator=gen, dtype=torch.float64)
    cov, means = a @ a.T / d, torch.randn(c, d, generator=gen, dtype=torch.float64)
    priors = torch.softmax(torch.randn(n, c, generator=gen, dtype=torch.float64), 1)
    once, bias_once = lda_head(means, cov, priors, 1e-4)
    for rows in ((means.expand(n, c, d), cov.expand(n, d, d)), (means.repeat(n, 1, 1), cov.repeat(n, 1, 1))):
        each, bias_each = lda_head(*rows, priors, 1e-4)
        assert torch.equal(each, once.expand(n, c, d)) and torch.equal(bias_each, bias_once)

def _authors_mle(z: torch.Tensor, y: np.ndarray, global_means: torch.Tensor, eps: float, min_samples: int):
    """The authors' ``compute_mle_statistics`` and covariance: per-class means where a class has more than
    ``min_samples`` samples, the within-class scatter, ``S/(N − 1) + ε + I``."""
    means = [None] * len(global_means)
    for k in np.unique(y):
        if (y == k).sum() > min_samples:
            means[k] = z[torch.as_tensor(y == k)].mean(0)
    centred = torch.cat([z[torch.as_tensor(y == k)] - (means[k] if means[k] is not None else global_means[k])
                         for k in np.unique(y)])
    cov = centred.T @ centred / (len(y) - 1) + eps + torch.eye(z.shape[1], dtype=z.dtype)
    return torch.stack([m if m is not None else global_means[k] for k, m in enumerate(means)]), cov


def test_pfedfdas_local_statistics_are_the_authors():
    from hetfed.algorithms.pfedfda import mle_statistics

    gen = torch.Generator().manual_seed(4)
    z = torch.randn(11, 3, generator=gen, dtype=torch.float64)
    y = np.array([0, 0, 0, 0, 1, 1, 2, 2, 2, 0, 1])  # class 1 has three samples, class 3 none
    global_means = torch.randn(4, 3, generator=gen, dtype=torch.float64)
    want_means, want_cov = _authors_mle(z, y, global_means, 1e-4, 2)
    means, cov = mle_statistics(z, torch.as_tensor(y), global_means, 1e-4, 2)
    torch.testing.assert_close(means, want_means)
    torch.testing.assert_close(cov, want_cov)
    assert torch.linalg.eigvalsh(cov).min() >= 1 - 1e-9  # positive definite: the authors' PSD clip is the identity
    means3, _ = mle_statistics(z, torch.as_tensor(y), global_means, 1e-4, 3)  # class 1 now at its minimum
    torch.testing.assert_close(means3[1], global_means[1])


def test_pfedfdas_beta_minimises_the_cross_validated_loss_of_the_interpolated_head():
    """β = argmin over [0, 1]² of Σ_folds CE(LDA(β·local + (1 − β)·global) on the held-out fold), the folds the
    authors' (two stratified folds, seed 0): no point of a 21 × 21 grid does better than the solver's."""
    from sklearn.model_selection import StratifiedKFold

    from hetfed.algorithms.pfedfda import PFedFDAParams, lda_head, solve_beta

    gen = torch.Generator().manual_seed(5)
    y = np.array([0] * 8 + [1] * 8 + [2] * 6 + [3])  # class 3 has one sample: left out of the folds
    centres = torch.tensor([[2.0, 0, 0], [0, 2.0, 0], [0, 0, 2.0], [1.0, 1, 1]], dtype=torch.float64)
    z = centres[y] + 0.7 * torch.randn(len(y), 3, generator=gen, dtype=torch.float64)
    gm = centres + torch.tensor([0.8, -0.5, 0.3], dtype=torch.float64)  # the global means: shifted
    gc = 2.0 * torch.eye(3, dtype=torch.float64)
    priors = torch.tensor([0.3, 0.3, 0.3, 0.1], dtype=torch.float64)
    p = PFedFDAParams()
    keep = y != 3
    folds = []
    for tr, te in StratifiedKFold(2, shuffle=True, random_state=0).split(np.zeros(keep.sum()), y[keep]):
        zk, yk = z[torch.as_tensor(keep)], y[keep]
        folds.append((*_authors_mle(zk[tr], yk[tr], gm, 1e-4, 2), zk[te], torch.as_tensor(yk[te])))

    def cv_loss(bm: float, bc: float) -> float:
        return sum(float(F.cross_entropy(zt @ w.T + b, yt)) for m, c, zt, yt in folds
                   for w, b in [lda_head(bm * m + (1 - bm) * gm, bc * c + (1 - bc) * gc, priors, p.eps)])

    b_mean, b_cov = solve_beta(z, torch.as_tensor(y), gm, gc, priors, p)
    assert 0 <= b_mean <= 1 and 0 <= b_cov <= 1
    grid = min(cv_loss(a, b) for a in np.linspace(0, 1, 21) for b in np.linspace(0, 1, 21))
    assert cv_loss(b_mean, b_cov) <= grid + 1e-3
    assert solve_beta(z, torch.as_tensor(y), gm, gc, priors, p.model_copy(update={"local_beta": True})) == (1.0, 1.0)
    one = solve_beta(z[:1], torch.as_tensor(y[:1]), gm, gc, priors, p)  # no fold can be built: the global ones
    assert one == (0.0, 0.0)


def test_a_pfedfda_client_trains_its_body_through_the_global_lda_head_and_uploads_its_adaptive_statistics():
    from hetfed.algorithms.pfedfda import COV, MEANS, adaptive_statistics, class_priors, lda_head

    algo, server, state, data, x, y = _setup("pfedfda")
    assert set(server.params) == set(BODY)  # the head is no parameter: it is built from the statistics
    bc = algo.broadcast(server, 0)
    priors = class_priors(y, 2, algo.params.eps)  # 3 of each class
    coef, bias = lda_head(server.extra[MEANS].double(), server.extra[COV].double(), priors, algo.params.eps)

    def logits(p, x):
        return torch.relu(x @ p[BODY[0]] + p[BODY[1]]) @ coef.float().T + bias.float()

    leaves = {k: v.clone().requires_grad_() for k, v in server.params.items()}
    grads = torch.autograd.grad(F.cross_entropy(logits(leaves, x), y), [leaves[k] for k in BODY])
    want = {k: server.params[k] - LR * g for k, g in zip(BODY, grads, strict=True)}
    upload, _ = algo.local_update(bc, {k: v.unsqueeze(0) for k, v in state.items()}, data)
    for k in BODY:
        torch.testing.assert_close(upload.params[k][0], want[k], rtol=1e-5, atol=1e-6)
    z = torch.relu(x @ want[BODY[0]] + want[BODY[1]])
    means, cov = adaptive_statistics(z, y, server.extra[MEANS], server.extra[COV], priors, algo.params)
    torch.testing.assert_close(upload.extra[MEANS][0], means.float(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(upload.extra[COV][0], cov.float(), rtol=1e-4, atol=1e-5)


def test_pfedfdas_server_averages_the_adaptive_statistics_by_training_samples():
    from dataclasses import replace

    from hetfed.algorithms.pfedfda import COV, MEANS

    algo, server, state, data, x, y = _setup("pfedfda")
    upload, _ = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    two = replace(upload, client_ids=[0, 1], params={k: v.repeat(2, *[1] * (v.dim() - 1)) for k,
                                                     v in upload.params.items()},
                  num_samples=torch.tensor([6.0, 2.0]),
                  extra={**upload.extra, MEANS: torch.stack([upload.extra[MEANS][0], torch.zeros(2, 4)]),
                         COV: torch.stack([upload.extra[COV][0], torch.eye(4)])})
    after = algo.aggregate(server, two)
    torch.testing.assert_close(after.extra[MEANS], 0.75 * upload.extra[MEANS][0])
    torch.testing.assert_close(after.extra[COV], 0.75 * upload.extra[COV][0] + 0.25 * torch.eye(4))


# ----------------------------------------------------------------------------------------------- Floco


def test_flocos_simplex_projection_is_the_euclidean_projection():
    """Each row's projection onto {β ≥ 0, Σβ = z} (Duchi et al. 2008) against SciPy's SLSQP on the same problem."""
    from scipy.optimize import minimize

    from hetfed.algorithms.floco import simplex_projection

    rng = np.random.default_rng(0)
    v = rng.normal(size=(5, 4))
    for z in (1.0, 0.3):
        got = simplex_projection(v, z)
        for row, p in zip(v, got, strict=True):
            ref = minimize(lambda b, row=row: ((b - row) ** 2).sum(), np.full(4, z / 4), method="SLSQP",
                           bounds=[(0, None)] * 4, constraints={"type": "eq", "fun": lambda b, z=z: b.sum() - z},
                           options={"ftol": 1e-12}).x
            np.testing.assert_allclose(p, ref, atol=1e-5)


def test_flocos_subregion_centres_are_the_least_riesz_energy_projection_of_the_pca_signals():
    """PCA to M dimensions, then for z on the authors' grid the projection renormalised; the centres are the one of
    least log Riesz s-energy (s = 2) — recomputed here with the authors' formula written out."""
    from sklearn.decomposition import PCA

    from hetfed.algorithms.floco import project_clients, simplex_projection

    rng = np.random.default_rng(1)
    signals = rng.normal(size=(6, 20))
    centres = project_clients(signals, 3)
    assert centres.shape == (6, 3) and np.all(centres >= 0)
    np.testing.assert_allclose(centres.sum(1), 1.0)
    kappa = PCA(3, svd_solver="full").fit_transform(signals)

    def energy(b):
        d = [max(np.linalg.norm(b[i] - b[j]), 1e-4) for i in range(6) for j in range(i + 1, 6)]
        return np.log(sum(1 / x**2 for x in d)) - np.log(len(d))

    cands = [simplex_projection(kappa, z) for z in np.linspace(1e-4, 1, 1000)]
    best = min((b / b.sum(1, keepdims=True) for b in cands), key=energy)
    np.testing.assert_allclose(centres, best)


def test_flocos_step_points_are_uniform_on_the_simplex_then_in_the_clients_l1_ball():
    from hetfed.algorithms.floco import simplex_alphas

    u = torch.rand(20000, 7, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    before = simplex_alphas(u, None, 0.3)
    assert (before >= 0).all() and torch.allclose(before.sum(1), torch.ones(20000, dtype=torch.float64))
    torch.testing.assert_close(before.mean(0), torch.full((3,), 1 / 3, dtype=torch.float64), atol=0.01, rtol=0)
    assert abs(float(before[:, 0].var()) - 1 / 18) < 0.003  # Dirichlet(1, 1, 1): Var = (1·2)/(3²·4)
    centre = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    after = simplex_alphas(u, centre.expand(20000, 3), 0.3)
    v = 2 * u[:, 3:6] - 1
    point = centre + 0.3 * u[:, 6:] * v / v.abs().sum(1, keepdim=True)
    torch.testing.assert_close(after, point / point.sum(1, keepdim=True))
    assert ((point - centre).abs().sum(1) <= 0.3 + 1e-12).all()
    assert (point - centre).abs().sum(1).max() > 0.29  # the whole ball, not only its centre


def test_a_floco_client_moves_each_endpoint_by_its_share_of_one_gradient_step_at_one_point():
    """One full-batch SGD step at the drawn point α: endpoint m moves by −lr·α_m·∇_W, so the endpoints' updates are
    proportional, and their ratios recover an α on the simplex; the body and bias take the plain step at W(α)."""
    from hetfed.algorithms.floco import ENDPOINT

    algo, server, state, data, x, y = _setup("floco", {"endpoints": 3})
    w = HEAD[0]
    names = [ENDPOINT.format(m=m, name=w) for m in range(3)]
    assert set(server.params) == {*BODY, HEAD[1], *names}
    upload, _ = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    moves = [server.params[k] - upload.params[k][0] for k in names]
    flat = torch.stack([m.flatten() for m in moves])  # [3, P], each α_m·lr·G
    alpha = flat.abs().sum(1) / flat.abs().sum()
    assert (alpha > 0).all()
    torch.testing.assert_close(flat, alpha[:, None] * flat.sum(0), rtol=1e-4, atol=1e-7)
    start = {**{k: server.params[k] for k in (*BODY, HEAD[1])},
             w: sum(a * server.params[k] for a, k in zip(alpha, names, strict=True))}
    want = _sgd(start, [*BODY, HEAD[1], w], x, y)
    for k in (*BODY, HEAD[1]):
        torch.testing.assert_close(upload.params[k][0], want[k], rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(sum(moves), start[w] - want[w], rtol=1e-4, atol=1e-6)  # Σ_m α_m·lr·G = lr·G


def test_floco_collects_every_client_in_round_tau_minus_one_and_places_them_by_their_endpoint_updates():
    from dataclasses import replace

    from hetfed.algorithms.floco import CENTRE, ENDPOINT, project_clients
    from hetfed.engine.types import ServerState

    algo, server, state, data, x, y = _setup("floco", {"endpoints": 2, "tau": 4})
    algo._clients = 4
    eligible = np.array([0, 1, 2, 3])
    rng = np.random.default_rng(0)
    assert algo.select_clients(server, eligible, 2, rng) is None  # round 1: the engine's sampling
    at = ServerState(server.params, 2, server.extra)  # two rounds done: the coming one is τ − 1 = 3
    assert algo.select_clients(at, eligible, 2, rng) == [0, 1, 2, 3]
    upload, _ = algo.local_update(algo.broadcast(at, 2), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    gen = torch.Generator().manual_seed(3)
    three = replace(upload, client_ids=[0, 2, 3], num_samples=torch.ones(3),
                    params={k: v + 0.1 * torch.randn(3, *v.shape[1:], generator=gen) for k, v in upload.params.items()})
    after = algo.aggregate(at, three)
    names = [ENDPOINT.format(m=m, name=HEAD[0]) for m in range(2)]
    signals = torch.cat([(at.params[k] - three.params[k]).flatten(1) for k in names], 1).double().numpy()
    table = after.extra[CENTRE]
    np.testing.assert_allclose(table[[0, 2, 3]].numpy(), project_clients(signals, 2), rtol=1e-5)
    assert table[1].tolist() == [0.5, 0.5]  # a client that did not report: the simplex's centre
    bc = algo.broadcast(after, 3).for_clients([2])
    pred = algo.predictor(bc, {k: v.unsqueeze(0) for k, v in state.items()}, 1)
    centre = table[2]
    w = {**{k: after.params[k] for k in (*BODY, HEAD[1])},
         HEAD[0]: sum(centre[m] * after.params[names[m]] for m in range(2))}
    torch.testing.assert_close(pred.model.forward(pred.params, x.unsqueeze(0))[0], _logits(w, x))
    assert algo.aggregate(after, three).extra[CENTRE] is table  # placed once
