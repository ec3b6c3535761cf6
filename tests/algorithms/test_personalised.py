"""#25: personalised methods on the registry, each distinctive step against a hand computation of its paper's
update (written here with plain tensors, not with hetfed's training loop), and the metrics the field reports."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hetfed import streams
from hetfed.algorithms import build_algorithm
from hetfed.config import ModelConfig, OptimizerConfig, TrainConfig
from hetfed.engine.rng import SERVER_INIT, torch_gen
from hetfed.engine.summary import summarise
from hetfed.engine.types import ClientData
from hetfed.models import build_model

LR = 0.1
BODY = ("layers.0.weight", "layers.0.bias")
HEAD = ("layers.1.weight", "layers.1.bias")
REPO = Path(__file__).resolve().parents[2]


def _setup(name: str, params: dict | None = None):
    """A one-hidden-layer MLP, one client with 6 samples, plain SGD and one full-batch step per phase."""
    train = TrainConfig(rounds=1, batch_size=64, local_epochs=1.0,
                        optimizer=OptimizerConfig(kind="sgd", lr=LR, momentum=0.0))
    model = build_model(ModelConfig(kind="mlp", hidden=[4]), (3,), 2)
    algo = build_algorithm(name, model, train, params, seed=7)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(6, 3, generator=gen), torch.tensor([0, 1, 1, 0, 1, 0])
    data = ClientData([0], x, y, [np.arange(6)], [123])
    server = algo.server_init(torch_gen(7, SERVER_INIT))
    return algo, server, algo.client_init(0, torch.Generator().manual_seed(1)), data, x, y


def _logits(p: dict, x: torch.Tensor) -> torch.Tensor:
    """The MLP by hand: relu(x W0 + b0) W1 + b1."""
    return torch.relu(x @ p[BODY[0]] + p[BODY[1]]) @ p[HEAD[0]] + p[HEAD[1]]


def _sgd(p: dict, names, x, y, extra=None) -> dict:
    """One plain gradient step on the named parameters of the mean cross-entropy (+ ``extra(p)``)."""
    leaves = {k: v.clone().requires_grad_(k in names) for k, v in p.items()}
    loss = F.cross_entropy(_logits(leaves, x), y)
    if extra is not None:
        loss = loss + extra(leaves)
    grads = torch.autograd.grad(loss, [leaves[k] for k in names])
    return {**p, **{k: (leaves[k] - LR * g).detach() for k, g in zip(names, grads, strict=True)}}


def _unstack(d: dict) -> dict:
    return {k: v[0] for k, v in d.items()}


def test_fedper_uploads_the_base_keeps_the_head_and_starts_from_fedavgs_model():
    algo, server, state, data, x, y = _setup("fedper")
    full = build_model(ModelConfig(kind="mlp", hidden=[4]), (3,), 2).init_shared(torch_gen(7, SERVER_INIT))
    assert set(server.params) == set(BODY)
    for k in HEAD:  # every client's head starts as the server's draw: round 0 is FedAvg's model
        assert torch.equal(state[k], full[k])
    upload, new = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    expected = _sgd({**server.params, **state}, [*BODY, *HEAD], x, y)  # both trained together (Alg. 1)
    assert set(upload.params) == set(BODY)  # the head never leaves the client
    for k in BODY:
        torch.testing.assert_close(upload.params[k][0], expected[k])
    for k in HEAD:
        torch.testing.assert_close(new[k][0], expected[k])


def test_lg_fedavg_uploads_the_head_and_keeps_the_representation():
    algo, server, state, data, x, y = _setup("lg_fedavg")
    assert set(server.params) == set(HEAD)
    upload, new = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    expected = _sgd({**server.params, **state}, [*BODY, *HEAD], x, y)
    assert set(upload.params) == set(HEAD)
    for k in HEAD:
        torch.testing.assert_close(upload.params[k][0], expected[k])
    for k in BODY:
        torch.testing.assert_close(new[k][0], expected[k])


def test_fedrep_fits_the_head_with_the_body_frozen_then_the_body_with_the_new_head_frozen():
    algo, server, state, data, x, y = _setup("fedrep", {"head_epochs": 1.0})
    upload, new = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    p = {**server.params, **state}
    after_head = _sgd(p, HEAD, x, y)  # phase 1: h ← h − η∇_h f(φ, h)
    after_body = _sgd(after_head, BODY, x, y)  # phase 2: φ ← φ − η∇_φ f(φ, h_new)
    for k in BODY:
        torch.testing.assert_close(upload.params[k][0], after_body[k])
    for k in HEAD:
        torch.testing.assert_close(new[k][0], after_head[k])  # the head kept is phase 1's
    assert set(new) == set(HEAD)


def test_ditto_updates_the_personal_model_proximal_to_the_received_global():
    lam = 0.5
    algo, server, state, data, x, y = _setup("ditto", {"lam": lam})
    personal = {k: state["ditto." + k] + 0.3 for k in server.params}  # v ≠ w, so the proximal term acts
    state = {**state, **{"ditto." + k: v for k, v in personal.items()}}
    upload, new = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    w = server.params
    global_step = _sgd(dict(w), list(w), x, y)  # 1. the global model: FedAvg's local SGD from w^t

    def prox(p):
        return 0.5 * lam * sum((p[k] - w[k]).pow(2).sum() for k in w)

    personal_step = _sgd(personal, list(w), x, y, prox)  # 2. v ← v − η(∇F(v) + λ(v − w^t))
    for k in w:
        torch.testing.assert_close(upload.params[k][0], global_step[k])
        torch.testing.assert_close(new["ditto." + k][0], personal_step[k])
    pred = algo.predictor(algo.broadcast(server, 1), new, 1)
    assert pred.personalised and all(torch.equal(pred.params[k], new["ditto." + k]) for k in w)


@pytest.mark.parametrize("name", ["fedper", "fedrep", "lg_fedavg"])
def test_a_body_head_method_without_hidden_layers_is_refused_in_one_line(name, capsys, tmp_path):
    from hetfed.cli import main

    assert main(["run", "--set", f"methods=[{{algorithm: {name}}}]", "--set", "model.hidden=[]",
                 "--set", "partition.clients=3", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: methods.0.algorithm = '{name}' is not allowed") and "hidden" in err[-1], err
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------ the metrics the field reports


def test_personal_accuracy_is_reported_weighted_by_test_size_and_for_the_worst_tenth_of_clients():
    acc = [0.9, 0.5, 1.0, 0.7, 0.8, 0.6, 0.95, 0.85, 0.75, 0.65, 0.55, 0.99]
    n = [10, 40, 5, 20, 10, 30, 10, 10, 10, 10, 20, 5]
    k = len(acc)
    reports = {"local_accuracy": acc, "local_loss": [0.0] * k, "local_n": n, "val_loss": [0.0] * k,
               "val_accuracy": [0.0] * k, "val_loss_sum": [0.0] * k, "val_n": [1] * k}
    m = summarise(reports, list(range(k)), np.zeros(k, dtype=bool), 10).metrics
    assert m["local_accuracy_weighted"] == pytest.approx(sum(a * b for a, b in zip(acc, n, strict=True)) / sum(n))
    assert m["local_accuracy_mean"] == pytest.approx(sum(acc) / k)
    assert m["local_accuracy_worst10"] == pytest.approx((0.5 + 0.55) / 2)  # ⌈0.1 · 12⌉ = 2 worst clients


def test_ifca_trains_the_cluster_model_with_the_lowest_loss_and_averages_per_cluster():
    from hetfed.engine.types import ServerState

    algo, server, state, data, x, y = _setup("ifca", {"clusters": 2})
    m0 = {k[len("ifca.0."):]: v for k, v in server.params.items() if k.startswith("ifca.0.")}
    m1 = {k: v.clone() for k, v in m0.items()}
    m1[HEAD[1]] = m1[HEAD[1]] + torch.tensor([-3.0, 3.0])  # θ_1 favours class 1 …
    ys = torch.ones(6, dtype=torch.long)  # … and the client's data is all class 1
    data = ClientData([0], x, ys, [np.arange(6)], [123])
    server = ServerState({**{f"ifca.0.{k}": v for k, v in m0.items()}, **{f"ifca.1.{k}": v for k, v in m1.items()}})
    losses = [F.cross_entropy(_logits(m, x), ys).item() for m in (m0, m1)]  # ĵ = argmin_j F_i(θ_j)
    assert losses[1] < losses[0]
    stacked = {k: v.unsqueeze(0) for k, v in state.items()}
    upload, _ = algo.local_update(algo.broadcast(server, 0), stacked, data)
    trained = _sgd(m1, list(m1), x, ys)
    assert upload.extra["cluster"].tolist() == [1.0]
    for k in m0:
        torch.testing.assert_close(upload.params[f"ifca.1.{k}"][0], trained[k])
        assert torch.equal(upload.params[f"ifca.0.{k}"][0], m0[k])  # the other cluster goes back as received

    # the server: per cluster, the sample-weighted mean of the clients that chose it; cluster 0 keeps θ_0
    from hetfed.engine.types import Upload

    a, b = {k: v + 1.0 for k, v in m1.items()}, {k: v - 2.0 for k, v in m1.items()}
    both = Upload([0, 1], {**{f"ifca.1.{k}": torch.stack([a[k], b[k]]) for k in m1},
                           **{f"ifca.0.{k}": torch.stack([m0[k], m0[k]]) for k in m0}},
                  torch.tensor([1.0, 3.0]), {"cluster": torch.tensor([1.0, 1.0])})
    new = algo.aggregate(server, both)
    for k in m1:
        torch.testing.assert_close(new.params[f"ifca.1.{k}"], (1 * a[k] + 3 * b[k]) / 4)
        assert torch.equal(new.params[f"ifca.0.{k}"], m0[k])


def test_ifca_with_one_cluster_is_fedavg(tmp_path):
    from hetfed.config import build_config
    from hetfed.runs.runner import run_experiment

    raw = {"partition": {"kind": "dirichlet", "alpha": 0.5, "clients": 4, "min_size": 20},
           "train": {"rounds": 2, "local_steps": 3, "batch_size": 16},
           "methods": [{"name": "fedavg", "algorithm": "fedavg"},
                       {"name": "ifca", "algorithm": "ifca", "params": {"clusters": 1}}]}
    s = run_experiment(build_config(raw), out=tmp_path / "r", progress=False).summary["methods"]
    for k in ("local_accuracy_mean", "val_loss"):
        assert s["ifca"]["final"][k] == pytest.approx(s["fedavg"]["final"][k], rel=1e-6)


def test_the_leaderboards_cnn_is_pfllibs_fedavg_cnn():
    """PFLlib's FedAvgCNN on 28×28: conv 1→32 (5×5) → pool → conv 32→64 → pool → fc 1024→512 → fc 512→10."""
    model = build_model(ModelConfig(kind="cnn4"), (28, 28), 10)
    by_hand = (32 * 25 + 32) + (64 * 32 * 25 + 64) + (1024 * 512 + 512) + (512 * 10 + 10)
    assert model.n_params() == by_hand == 582_026
    params = {k: v.unsqueeze(0) for k, v in model.init_shared(torch.Generator().manual_seed(0)).items()}
    assert model.forward(params, torch.zeros(1, 5, 784)).shape == (1, 5, 10)
    assert model.head_names == ("fc.weight", "fc.bias")
    small = build_model(ModelConfig(kind="cnn4"), (8, 8), 10)  # digits: padded so the convolutions fit
    p = {k: v.unsqueeze(0) for k, v in small.init_shared(torch.Generator().manual_seed(0)).items()}
    assert small.forward(p, torch.zeros(1, 3, 64)).shape == (1, 3, 10)


def test_a_saved_personalised_run_predicts_per_client_and_says_why_there_is_no_global_model(tmp_path):
    import hetfed
    from hetfed.config import build_config
    from hetfed.errors import ConfigError
    from hetfed.runs.runner import run_experiment

    raw = {"partition": {"kind": "dirichlet", "alpha": 0.5, "clients": 3, "min_size": 20},
           "train": {"rounds": 1, "local_steps": 2},
           "methods": [{"name": "fedper", "algorithm": "fedper"}, {"name": "ditto", "algorithm": "ditto"}]}
    run_experiment(build_config(raw), out=tmp_path / "r", progress=False)
    run = hetfed.open_run(tmp_path / "r")
    x = np.zeros((4, 64), dtype=np.float32)
    assert run.model("fedper").predict(x, client=1).shape == (4,)
    with pytest.raises(ConfigError, match="client=None is not allowed for fedper: its server keeps no whole model"):
        run.model("fedper").predict(x)
    assert run.model("ditto").predict(x).shape == (4,)  # Ditto's server model is whole: the unseen client's


def test_apfl_steps_the_global_copy_the_local_model_and_alpha_as_algorithm_1():
    algo, server, state, data, x, y = _setup("apfl", {"alpha": 0.3})
    w = server.params
    v = {k: state["apfl.v." + k] - 0.2 for k in w}  # v ≠ w so that α's gradient ⟨v − w, ∇f(v̄)⟩ is not 0
    state = {**state, **{"apfl.v." + k: t for k, t in v.items()}}
    upload, new = algo.local_update(algo.broadcast(server, 0), {k: t.unsqueeze(0) for k, t in state.items()}, data)
    a = 0.3
    g_w = _grads(w, x, y)  # ∇f(w)
    v_bar = {k: a * v[k] + (1 - a) * w[k] for k in w}
    g_bar = _grads(v_bar, x, y)  # ∇f(v̄), all from the values before the step
    for k in w:
        torch.testing.assert_close(upload.params[k][0], w[k] - LR * g_w[k])  # w ← w − η∇f(w)
        torch.testing.assert_close(new["apfl.v." + k][0], v[k] - LR * a * g_bar[k])  # v ← v − η α ∇f(v̄)
    alpha = a - LR * sum(((v[k] - w[k]) * g_bar[k]).sum() for k in w)  # Eq. 10
    torch.testing.assert_close(new["apfl.alpha"][0], alpha.clamp(0, 1))
    pred = algo.predictor(algo.broadcast(server, 1), new, 1)  # α v + (1 − α) w with the received w
    for k in w:
        expected = new["apfl.alpha"][0] * new["apfl.v." + k][0] + (1 - new["apfl.alpha"][0]) * w[k]
        torch.testing.assert_close(pred.params[k][0], expected)


def test_apfls_alpha_stays_in_the_unit_interval():
    algo, server, state, data, x, y = _setup("apfl", {"alpha": 0.99})
    state = {**state, **{"apfl.v." + k: state["apfl.v." + k] + 5.0 for k in server.params}}  # a huge gradient on α
    for _ in range(3):
        _, new = algo.local_update(algo.broadcast(server, 0), {k: t.unsqueeze(0) for k, t in state.items()}, data)
        state = {k: t[0] for k, t in new.items()}
        assert 0.0 <= float(state["apfl.alpha"]) <= 1.0


def _grads(p: dict, x, y) -> dict:
    leaves = {k: t.clone().requires_grad_(True) for k, t in p.items()}
    loss = F.cross_entropy(_logits(leaves, x), y)
    return dict(zip(leaves, torch.autograd.grad(loss, list(leaves.values())), strict=True))


def test_fedbabu_trains_the_body_under_a_fixed_head_and_fine_tunes_the_whole_model_after():
    algo, server, state, data, x, y = _setup("fedbabu", {"finetune_epochs": 1.0})
    bc = algo.broadcast(server, 0)
    upload, new = algo.local_update(bc, {k: v.unsqueeze(0) for k, v in state.items()}, data)
    expected = _sgd(dict(server.params), list(BODY), x, y)  # body ← body − η∇_body f; the head never moves
    for k in BODY:
        torch.testing.assert_close(upload.params[k][0], expected[k])
    for k in HEAD:
        assert torch.equal(upload.params[k][0], server.params[k])
    tuned, info = algo.personalise(bc, new, data)
    whole = _sgd(dict(server.params), [*BODY, *HEAD], x, y)  # fine-tuning: one epoch of the whole model
    pred = algo.predictor(bc, tuned, 1, "fedbabu_ft")
    for k in whole:
        torch.testing.assert_close(pred.params[k][0], whole[k])
    # the fine-tuned row reports the fine-tuning's epochs and seconds (it said 0 and 0 when they were keyed otherwise)
    from hetfed.engine.evaluate import Evaluation
    from hetfed.executors.updates import SimulationResult
    from hetfed.runs.summary import view_row

    result = SimulationResult(server, views={"fedbabu_ft": Evaluation({}, {})},
                              personal_info={k: [float(x) for x in v] for k, v in info.items()})
    row, filed_under = view_row(algo, "fedbabu_ft", result, 0.0)
    assert row["epochs"] == filed_under == 1 and row["wall_seconds"] > 0


@pytest.mark.parametrize("variant", ["fo", "hf"])
def test_per_fedavg_takes_algorithm_1s_meta_step_on_independent_batches(variant):
    inner, b = 0.05, 3
    train = TrainConfig(rounds=1, batch_size=b, local_steps=1,
                        optimizer=OptimizerConfig(kind="sgd", lr=LR, momentum=0.0))
    model = build_model(ModelConfig(kind="mlp", hidden=[4]), (3,), 2)
    algo = build_algorithm("perfedavg", model, train, {"inner_lr": inner, "variant": variant}, seed=7)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(9, 3, generator=gen), torch.tensor([0, 1, 1, 0, 1, 0, 1, 1, 0])
    server = algo.server_init(torch_gen(7, SERVER_INIT))
    upload, _ = algo.local_update(algo.broadcast(server, 0), {}, ClientData([0], x, y, [np.arange(9)], [123]))
    # the client's first epoch order (its round seed's counter-based permutation): the step's batch of 2B (3B)
    # rows, split into D, D', D''
    perm = streams.permutations(streams.keys([123], "cpu"), [9], [1]).numpy()
    d, d1, d2 = perm[:b], perm[b:2 * b], perm[2 * b:3 * b]
    w = dict(server.params)
    g = _grads(w, x[d], y[d])
    w_tilde = {k: w[k] - inner * g[k] for k in w}  # w̃ = w − α∇f(w; D)
    v = _grads(w_tilde, x[d1], y[d1])  # ∇f(w̃; D')
    if variant == "hf":  # (I − α∇²f(w; D''))·v, the Hessian-vector product by double backward
        names = list(w)

        def loss(*ps):
            return F.cross_entropy(_logits(dict(zip(names, ps, strict=True)), x[d2]), y[d2])

        _, hv = torch.autograd.functional.hvp(loss, tuple(w[k] for k in names), tuple(v[k] for k in names))
        v = {k: v[k] - inner * h for k, h in zip(names, hv, strict=True)}
    for k in w:
        torch.testing.assert_close(upload.params[k][0], w[k] - LR * v[k])


def test_per_fedavg_with_pfllibs_two_settings_takes_pfllibs_round():
    """PFLlib's Per-FedAvg: its server calls each client's ``train()`` twice a round, and each batch of 2B (its loader)
    takes w̃ = w − lr·∇f(w; first B), then w ← w − β·∇f(w̃; last B) with β = lr (``self.beta =
    self.learning_rate``) — as many meta-steps a round as FedAvg's round has steps. hetfed's Per-FedAvg with
    ``train.local_epochs: 2`` and ``params.inner_lr`` = the learning rate is that round, and the PFLlib protocol's
    config sets both."""
    from hetfed.config import load_config

    n, b = 12, 3
    train = TrainConfig(rounds=1, batch_size=b, local_epochs=2,
                        optimizer=OptimizerConfig(kind="sgd", lr=LR, momentum=0.0))
    model = build_model(ModelConfig(kind="mlp", hidden=[4]), (3,), 2)
    algo = build_algorithm("perfedavg", model, train, {"inner_lr": LR}, seed=7)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(n, 3, generator=gen), torch.randint(0, 2, (n,), generator=gen)
    server = algo.server_init(torch_gen(7, SERVER_INIT))
    upload, _ = algo.local_update(algo.broadcast(server, 0), {}, ClientData([0], x, y, [np.arange(n)], [123]))
    w = dict(server.params)
    steps = 0
    for perm in streams.permutations(streams.keys([123], "cpu"), [n], [2]).numpy().reshape(2, n):  # train() twice
        for batch in perm.reshape(-1, 2 * b):  # PFLlib's loader of 2B, split in two
            g = _grads(w, x[batch[:b]], y[batch[:b]])
            w_tilde = {k: w[k] - LR * g[k] for k in w}
            v = _grads(w_tilde, x[batch[b:]], y[batch[b:]])
            w = {k: w[k] - LR * v[k] for k in w}  # the parameters restored, then the step of size β = lr
            steps += 1
    for k in w:
        torch.testing.assert_close(upload.params[k][0], w[k])
    assert steps == n // b  # FedAvg's steps in a round of one epoch
    config = load_config(str(REPO / "configs" / "leaderboard_pfllib_fmnist.yaml"))
    method = next(m for m in config.methods if m.algorithm == "perfedavg")
    assert method.params["inner_lr"] == config.train.optimizer.lr
    assert method.train["local_epochs"] == 2 * config.train.local_epochs


def test_per_fedavg_adapts_by_one_step_on_the_clients_training_data_before_it_predicts():
    algo, server, state, data, x, y = _setup("perfedavg", {"inner_lr": 0.2})
    stacked = {k: v.unsqueeze(0) for k, v in server.params.items()}
    adapted = algo.adapted(stacked, x, y, [np.arange(6)])
    g = _grads(dict(server.params), x, y)
    for k in server.params:
        torch.testing.assert_close(adapted[k][0], server.params[k] - 0.2 * g[k])


def test_pfedme_solves_the_moreau_envelope_by_k_steps_then_pulls_w_towards_theta():
    lam, eta_p = 2.0, 0.05
    algo, server, state, data, x, y = _setup("pfedme", {"lam": lam, "personal_lr": eta_p, "inner_steps": 2})
    upload, new = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    w = dict(server.params)
    theta = dict(w)  # θ starts at the received global model
    for _ in range(2):  # θ ← θ − η_p(∇f(θ; D) + λ(θ − w))
        g = _grads(theta, x, y)
        theta = {k: theta[k] - eta_p * (g[k] + lam * (theta[k] - w[k])) for k in w}
    for k in w:
        torch.testing.assert_close(upload.params[k][0], w[k] - LR * lam * (w[k] - theta[k]))  # w ← w − ηλ(w − θ̃)
        torch.testing.assert_close(new["pfedme.theta." + k][0], theta[k])


def test_fedala_learns_elementwise_weights_on_the_top_layer_and_merges_before_training():
    eta = 0.7
    algo, server, state, data, x, y = _setup("fedala", {"eta": eta, "sample_percent": 100.0, "layers": 2})
    glob = dict(server.params)
    own = {k: v + 0.4 for k, v in glob.items()}  # the client's previous model Θ_i ≠ Θ
    w0 = {k: torch.full_like(glob[k], 0.5) for k in HEAD}
    state = {**{"ala.model." + k: v for k, v in own.items()}, **{"ala.w." + k: v for k, v in w0.items()},
             "ala.settled": torch.tensor(1.0)}  # past its first ALA: one epoch of W per round
    upload, new = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    merged = {k: own[k] + (glob[k] - own[k]) * w0[k] if k in HEAD else glob[k] for k in glob}  # Θ̂ (Eq. 5)
    g = _grads(merged, x, y)
    w1 = {k: (w0[k] - eta * g[k] * (glob[k] - own[k])).clamp(0, 1) for k in HEAD}  # W ← clip(W − η∇Θ̂L ⊙ (Θ − Θ_i))
    for k in HEAD:
        torch.testing.assert_close(new["ala.w." + k][0], w1[k])
    merged = {k: own[k] + (glob[k] - own[k]) * w1[k] if k in HEAD else glob[k] for k in glob}
    trained = _sgd(merged, list(merged), x, y)  # then the usual local training from Θ̂
    for k in glob:
        torch.testing.assert_close(upload.params[k][0], trained[k])
        torch.testing.assert_close(new["ala.model." + k][0], trained[k])


def test_fedala_skips_the_merge_while_the_clients_model_is_the_global_one():
    algo, server, state, data, x, y = _setup("fedala")
    upload, new = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    trained = _sgd(dict(server.params), list(server.params), x, y)  # round 0: Θ_i = Θ, plain local training
    for k in server.params:
        torch.testing.assert_close(upload.params[k][0], trained[k])
    assert all(bool((new["ala.w." + k] == 1).all()) for k in HEAD) and float(new["ala.settled"][0]) == 0.0


def test_cfl_splits_a_stationary_cluster_by_the_cosine_similarity_of_its_members_updates():
    from hetfed.engine.types import ServerState, Upload

    algo, _, _, _, _, _ = _setup("cfl", {"eps1": 0.4, "eps2": 1.6, "warmup_rounds": 0})
    model = build_model(ModelConfig(kind="mlp", hidden=[4]), (3,), 2).init_shared(torch.Generator().manual_seed(3))
    server = ServerState({f"cfl.0.{k}": v for k, v in model.items()}, round=5,
                         extra={"cfl.cluster_of": torch.zeros(4)})
    gen = torch.Generator().manual_seed(5)
    d = {k: torch.randn(v.shape, generator=gen) for k, v in model.items()}
    scale = 2.0 / float(torch.cat([t.flatten() for t in d.values()]).norm())  # ‖Δ‖ = 2 > ε₂ = 1.6
    signs = [1.0, 1.0, -1.0, -1.0]  # two groups pulling opposite ways: the mean update is ~0 < ε₁
    wobble = [0.0, 0.05, 0.0, 0.05]
    updates = [{k: s * scale * d[k] + w * scale * torch.ones_like(d[k]) for k in d} for s, w in zip(signs, wobble,
                                                                                                 strict=True)]
    upload = Upload([0, 1, 2, 3], {f"cfl.0.{k}": torch.stack([model[k] + u[k] for u in updates]) for k in model},
                    torch.tensor([1.0, 3.0, 2.0, 2.0]))
    new = algo.aggregate(server, upload)
    assert new.extra["cfl.cluster_of"].tolist() in ([0, 0, 1, 1], [1, 1, 0, 0])  # split by the sign of the update
    flat = [torch.cat([u[k].flatten() for k in model]).double() for u in updates]  # Algorithm 1's two norms, found
    found = algo.findings(new, upload)
    assert found["update_norm_mean"] == pytest.approx(float(torch.stack(flat).mean(0).norm()), rel=1e-6)
    assert found["update_norm_max"] == pytest.approx(max(float(f.norm()) for f in flat), rel=1e-6)
    assert found["update_norm_mean"] < 0.4 < 1.6 < found["update_norm_max"]
    c01 = int(new.extra["cfl.cluster_of"][0])
    for k in model:  # each new cluster: the cluster's model plus its members' sample-weighted mean update
        torch.testing.assert_close(new.params[f"cfl.{c01}.{k}"], model[k] + (1 * updates[0][k] + 3 * updates[1][k]) / 4)
        torch.testing.assert_close(new.params[f"cfl.{1 - c01}.{k}"], model[k] + (updates[2][k] + updates[3][k]) / 2)

    # not stationary (every update the same way): no split, FedAvg on the cluster
    same = Upload([0, 1, 2, 3], {f"cfl.0.{k}": torch.stack([model[k] + updates[0][k]] * 4) for k in model},
                  torch.ones(4))
    whole = algo.aggregate(server, same)
    assert whole.extra["cfl.cluster_of"].tolist() == [0, 0, 0, 0]
    found = algo.findings(whole, same)  # every update alike: the mean's norm is each one's
    assert found["update_norm_mean"] == pytest.approx(float(flat[0].norm()), rel=1e-6)
    assert found["update_norm_max"] == pytest.approx(found["update_norm_mean"], rel=1e-6)
    warming, _, _, _, _, _ = _setup("cfl", {"eps1": 0.4, "eps2": 1.6, "warmup_rounds": 20})
    early = warming.aggregate(server, upload)  # round 5 of a 20-round warm-up: no split, its norms written all the same
    assert early.extra["cfl.cluster_of"].tolist() == [0, 0, 0, 0]
    assert warming.findings(early, upload)["update_norm_max"] == pytest.approx(max(float(f.norm()) for f in flat))


def test_the_heterogeneity_figure_draws_each_method_against_delta_gamma_in_order():
    from hetfed.analysis.figures import plot_accuracy_vs_heterogeneity

    points = {"fedavg": [(1.6, 0.78, 0.1, "dirichlet"), (0.2, 0.95, 0.01, "iid")],
              "fedrep": [(0.2, 0.9, 0.02, "iid"), (1.6, 0.97, 0.03, "dirichlet")]}
    fig = plot_accuracy_vs_heterogeneity(points, "local_accuracy_weighted", None)
    lines = [container.lines[0] for container in fig.axes[0].containers]  # each method's data line
    assert [list(line.get_xdata()) for line in lines] == [[0.2, 1.6], [0.2, 1.6]]  # sorted by ΔΓ
    assert [list(line.get_ydata()) for line in lines] == [[0.95, 0.78], [0.9, 0.97]]
    assert "ΔΓ" in fig.axes[0].get_xlabel()


def test_batch_norm_trains_on_each_clients_real_rows_and_updates_its_running_statistics():
    from hetfed.engine.local import LocalSchedule, train_stack

    model = build_model(ModelConfig(kind="cnn4", batch_norm=True), (8, 8), 3)
    init = model.init_shared(torch.Generator().manual_seed(0))
    params = {k: torch.stack([v, v]) for k, v in init.items()}  # two clients, the same start
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(10, 64, generator=gen), torch.randint(0, 3, (10,), generator=gen)
    data = ClientData([0, 1], x, y, [np.arange(6), np.arange(6, 9)], [5, 6])  # 6 and 3 rows: client 1 is padded
    opt = OptimizerConfig(kind="sgd", lr=0.01, momentum=0.0)
    out, _, _ = train_stack(model, params, data, LocalSchedule(batch_size=8, epochs=1.0), opt, 0.01)
    for k, rows in ((0, np.arange(6)), (1, np.arange(6, 9))):
        conv = F.conv2d(x[rows].reshape(-1, 1, 8, 8), init["conv1.weight"], init["conv1.bias"], padding=2)
        per_channel = conv.transpose(0, 1).reshape(32, -1)  # the client's real rows only, every position
        mean, var = per_channel.mean(1), per_channel.var(1, unbiased=True)
        torch.testing.assert_close(out["bn1.running_mean"][k], 0.1 * mean)  # (1 − 0.1)·0 + 0.1·mean
        torch.testing.assert_close(out["bn1.running_var"][k], 0.9 + 0.1 * var)  # PyTorch's unbiased running var
    assert not torch.equal(out["bn1.weight"], params["bn1.weight"])  # γ trains; the statistics are not gradients


def test_fedbn_keeps_every_batch_norm_layer_on_the_client():
    train = TrainConfig(rounds=1, batch_size=8, local_epochs=1.0, optimizer=OptimizerConfig(kind="sgd", lr=0.01))
    model = build_model(ModelConfig(kind="cnn4", batch_norm=True), (8, 8), 3)
    algo = build_algorithm("fedbn", model, train, seed=7)
    server = algo.server_init(torch_gen(7, SERVER_INIT))
    bn = {s.name for s in model.specs() if s.name.startswith("bn")}
    assert len(bn) == 12 and not bn & set(server.params)
    state = algo.client_init(0, torch.Generator().manual_seed(1))
    gen = torch.Generator().manual_seed(2)
    data = ClientData([0], torch.randn(6, 64, generator=gen), torch.randint(0, 3, (6,), generator=gen),
                      [np.arange(6)], [3])
    upload, new = algo.local_update(algo.broadcast(server, 0), {k: v.unsqueeze(0) for k, v in state.items()}, data)
    assert set(upload.params) == set(server.params)  # no γ, β or running statistic leaves
    assert bn <= set(new) and not torch.equal(new["bn1.running_mean"][0], state["bn1.running_mean"])


def _each_clients_own_step(server, x, y, splits, blocked, whole) -> None:
    """Each client's adapted model, computed in blocks, is the padded stack's and its own split's step (α = 0.2)."""
    for j, split in enumerate(splits):
        grads = _grads(dict(server.params), x[split], y[split])
        for k in server.params:
            torch.testing.assert_close(blocked[k][j], whole[k][j])
            torch.testing.assert_close(blocked[k][j], server.params[k] - 0.2 * grads[k])


def test_per_fedavgs_adaptation_in_blocks_of_samples_is_the_whole_splits_step(monkeypatch):
    """#72 (found on a GPU): the evaluation's adaptation step went through every client's whole split at once —
    past 2³¹ elements for PFLlib's CNN on Fashion-MNIST, which CUDA refuses. In blocks it is the same step, for
    clients of unequal sizes."""
    from hetfed.algorithms import perfedavg

    algo, server, _state, _data, _x, _y = _setup("perfedavg", {"inner_lr": 0.2})
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(40, _x.shape[1], generator=g), torch.randint(0, 2, (40,), generator=g)
    stacked = {k: v.unsqueeze(0).repeat(3, *([1] * v.dim())) for k, v in server.params.items()}
    splits = [np.arange(0, 17), np.arange(17, 22), np.arange(22, 40)]
    whole = algo.adapted(stacked, x, y, splits)
    monkeypatch.setattr(perfedavg, "ADAPT_BLOCK_FLOATS", 3 * x.shape[1] * 4)  # blocks of 4 samples per client
    blocked = algo.adapted(stacked, x, y, splits)
    _each_clients_own_step(server, x, y, splits, blocked, whole)


def test_per_fedavgs_adaptation_of_unequal_clients_in_size_blocks_is_each_clients_own_step(monkeypatch):
    """The clients adapt in blocks of similar split sizes (the stack padded to its largest split computed ~4× the
    samples on PFLlib's protocol): each client's step is still its own whole split's, as in one padded stack."""
    from hetfed.engine import evaluate

    algo, server, _state, _data, _x, _y = _setup("perfedavg", {"inner_lr": 0.2})
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(200, _x.shape[1], generator=g), torch.randint(0, 2, (200,), generator=g)
    stacked = {k: v.unsqueeze(0).repeat(6, *([1] * v.dim())) for k, v in server.params.items()}
    cuts = np.cumsum([0, 150, 3, 148, 40, 4, 38])  # three pairs of near sizes
    splits = [np.arange(a, b) % 200 for a, b in zip(cuts[:-1], cuts[1:], strict=True)]
    whole = algo.adapted(stacked, x, y, splits)  # a call dearer than the padding: one block
    # a call worth 10 rows: the pairs (3, 4), (38, 40), (148, 150) are the cheapest blocks
    monkeypatch.setattr(evaluate, "CPU_CALL_FLOATS", 10 * algo.model.activation_floats(1))
    assert [sorted(b.tolist()) for b in evaluate.size_blocks(
        np.array([len(s) for s in splits]), call_rows=evaluate.call_rows(algo.model, x))] == [[1, 4], [3, 5], [0, 2]]
    blocked = algo.adapted(stacked, x, y, splits)
    _each_clients_own_step(server, x, y, splits, blocked, whole)


def test_the_pfllib_protocol_runs_fedrep_fedbabu_and_apfl_at_pfllibs_own_defaults():
    """PFLlib's system/main.py (d832e76): ``--plocal_epochs 1`` (FedRep's head epochs), ``--fine_tuning_epochs 10``
    (FedBABU's, after the rounds), ``--alpha 1.0`` (APFL's initial α) — where hetfed's defaults are the methods'
    authors' (9, 5, 0.5). The protocol's config compares with PFLlib's published rows, so it takes PFLlib's."""
    from hetfed.algorithms import registry
    from hetfed.config import load_config

    config = load_config(str(REPO / "configs" / "leaderboard_pfllib_fmnist.yaml"))
    given = {m.algorithm: m.params for m in config.methods}
    pfllib = {"fedrep": {"head_epochs": 1}, "fedbabu": {"finetune_epochs": 10}, "apfl": {"alpha": 1.0}}
    for algorithm, params in pfllib.items():
        assert given[algorithm] == params, algorithm
        defaults = registry.get(algorithm).params().model_dump()
        assert all(defaults[k] != v for k, v in params.items()), algorithm  # each a setting the config must make
