"""Agnostic FL (Mohri et al. 2019) against its equations as the authors' code (q-FFL's fair_flearn, afl.py) runs
them: one full-batch gradient a client, w ← w − η Σ λ_k g_k, λ ← Π_Δ(λ + γ F(w)), the iterates' mean reported;
the projection onto the simplex by its defining conditions; a run's saved model is the mean it scored."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.algorithms import build_algorithm
from hetfed.algorithms.agnostic_fl import AVERAGE, LAMBDAS, simplex_projection
from hetfed.config import ModelConfig, OptimizerConfig, PartitionConfig, TrainConfig
from hetfed.engine.rng import CLIENT_INIT, SERVER_INIT, torch_gen
from hetfed.engine.types import stack_states
from hetfed.executors.inprocess import Pool, client_data
from hetfed.interface import reported
from hetfed.models import build_model
from hetfed.partition import make_federation
from tests.synthetic import ShiftedGaussians

LR = 0.3


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-5, 5, allow_nan=False), min_size=1, max_size=30))
def test_the_projection_is_the_simplex_point_its_conditions_define(values):
    """x = Π_Δ(v) exactly when x ≥ 0, Σ x = 1 and one θ has x_i = v_i − θ where x_i > 0 and v_i ≤ θ where x_i = 0."""
    v = torch.tensor(values, dtype=torch.float64)
    x = simplex_projection(v)
    assert (x >= 0).all() and abs(float(x.sum()) - 1) < 1e-12
    inside = x > 0
    theta = v[inside] - x[inside]
    assert float(theta.max() - theta.min()) < 1e-12
    assert (v[~inside] <= theta[0] + 1e-12).all()


def test_a_point_of_the_simplex_projects_onto_itself():
    v = torch.tensor([0.1, 0.0, 0.6, 0.3], dtype=torch.float64)
    assert torch.allclose(simplex_projection(v), v, atol=1e-15)


def _setting(params: dict):
    fed = make_federation(ShiftedGaussians(n=240, d=5, classes=3), PartitionConfig(
        kind="dirichlet", clients=5, alpha=0.5, min_size=10), 0)
    model = build_model(ModelConfig(kind="logreg"), fed.input_shape, fed.n_classes)
    # the authors' step: one gradient of each client's whole training set, plain SGD
    train = TrainConfig(local_steps=1, batch_size=10_000, optimizer=OptimizerConfig(lr=LR, momentum=0.0))
    algo = build_algorithm("agnostic_fl", model, train, params)
    algo.bind(fed)
    pool = Pool(torch.as_tensor(fed.x), torch.as_tensor(fed.y), fed.train, 0, fed.val)
    return fed, model, algo, pool


def _gradient_and_loss(model, w: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor):
    """∇F_k(w) and F_k(w): the mean cross-entropy of client k's training samples, by autograd."""
    leaves = {k: v.detach().clone().requires_grad_() for k, v in w.items()}
    loss = F.cross_entropy(model.forward({k: v.unsqueeze(0) for k, v in leaves.items()}, x.unsqueeze(0), None)[0], y)
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return dict(zip(leaves, grads, strict=True)), float(loss.detach())


@pytest.mark.parametrize("lambda_lr", [0.05, 2.0])
def test_two_rounds_are_the_authors_minimax_steps(lambda_lr):
    """Round by round against the equations with every client: the model's gradient step weighted by λ, λ's
    projected ascent on the losses F_k(w_t) (γ 2.0: some λ_k projected to 0), and the mean of w_1 … w_t scored."""
    fed, model, algo, pool = _setting({"lambda_lr": lambda_lr})
    clients = list(range(fed.n_clients))
    server = algo.server_init(torch_gen(0, SERVER_INIT))
    states = stack_states([algo.client_init(k, torch_gen(0, CLIENT_INIT, k)) for k in clients])
    lam = torch.full((len(clients),), 1 / len(clients), dtype=torch.float64)
    w = {k: v.clone() for k, v in server.params.items()}
    iterates, edge = [], False
    for r in range(2):
        upload, states = algo.local_update(algo.broadcast(server, r), states, client_data(pool, clients, r))
        steps = [_gradient_and_loss(model, w, torch.as_tensor(fed.x[fed.train[k]]),
                                    torch.as_tensor(fed.y[fed.train[k]])) for k in clients]
        losses = torch.tensor([loss for _, loss in steps], dtype=torch.float64)
        np.testing.assert_allclose(upload.extra["start_loss"].numpy(), losses.numpy(), rtol=1e-6)
        w = {k: (v.double() - LR * sum(float(lam[i]) * g[k].double() for i, (g, _) in enumerate(steps))).float()
             for k, v in w.items()}
        lam = simplex_projection(lam + lambda_lr * losses)
        edge = edge or bool((lam == 0).any())
        server = algo.aggregate(server, upload)
        iterates.append(w)
        for k, v in w.items():
            np.testing.assert_allclose(server.params[k].numpy(), v.numpy(), rtol=1e-5, atol=1e-6)
            mean = sum(i[k] for i in iterates) / len(iterates)
            np.testing.assert_allclose(server.extra[AVERAGE][k].numpy(), mean.numpy(), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(server.extra[LAMBDAS].numpy(), lam.numpy(), atol=1e-6)  # float32 losses
        found = algo.findings(server, upload)  # where λ stands, as the round's metrics say it
        assert found["lambda_max"] == pytest.approx(float(lam.max()), abs=1e-6)
        assert found["lambda_min"] == pytest.approx(float(lam.min()), abs=1e-6)
        assert found["lambda_top_client"] == float(np.argmax(lam.numpy()))
        assert found["lambda_clients"] == pytest.approx(1 / float((lam**2).sum()), rel=1e-5)
    assert float(lam.std()) > 0 and edge == (lambda_lr > 1)  # λ moved off uniform (γ 2: onto the simplex's edge)
    assert reported(algo, server).params is server.extra[AVERAGE]
    assert any(not torch.equal(server.params[k], v) for k, v in server.extra[AVERAGE].items())


def test_clients_left_out_keep_their_weight_before_the_projection_and_a_zero_weight_round_stands_still():
    fed, _, algo, pool = _setting({"lambda_lr": 0.5})
    server = algo.server_init(torch_gen(0, SERVER_INIT))
    states = stack_states([algo.client_init(k, torch_gen(0, CLIENT_INIT, k)) for k in (1, 3)])
    upload, _ = algo.local_update(algo.broadcast(server, 0), states, client_data(pool, [1, 3], 0))
    after = algo.aggregate(server, upload)
    ascent = torch.full((5,), 0.2, dtype=torch.float64)
    ascent[[1, 3]] += 0.5 * upload.extra["start_loss"].double()
    assert torch.allclose(after.extra[LAMBDAS], simplex_projection(ascent), atol=1e-15)
    zero = type(server)(server.params, server.round, {**server.extra, LAMBDAS: torch.tensor([.5, 0, .5, 0, 0.],
                                                                                           dtype=torch.float64)})
    still = algo.aggregate(zero, upload)
    assert all(torch.equal(still.params[k], v) for k, v in server.params.items())
    assert still.round == 1


def test_without_bind_its_server_refuses_to_start():
    model = build_model(ModelConfig(kind="logreg"), (5,), 3)
    algo = build_algorithm("agnostic_fl", model, TrainConfig(), {})
    with pytest.raises(RuntimeError, match="bind"):
        algo.server_init(torch_gen(0, SERVER_INIT))


def _final_model(tmp_path, name: str, rounds: int, average: bool):
    """A run of Agnostic FL on digits: its saved final model's parameters, that model, and the run."""
    from hetfed.api import open_run, run

    out = tmp_path / name
    run({"seed": 0, "dataset": {"name": "digits"}, "embed": {"kind": "identity"},
         "partition": {"kind": "dirichlet", "clients": 4, "alpha": 0.5},
         "model": {"kind": "logreg"}, "heterogeneity": {"iid_draws": 0},
         "train": {"rounds": rounds, "local_steps": 1, "batch_size": 10_000, "eval_every": 1,
                   "optimizer": {"kind": "sgd", "lr": 0.1, "momentum": 0.0}},
         "methods": [{"name": "agn", "algorithm": "agnostic_fl", "params": {"average": average}}]},
        out=out, progress=False, report=False)
    opened = open_run(out)
    model = opened.model("agn", "final")
    return model.shared, model, opened


def test_a_run_saves_and_scores_the_mean_of_its_iterates(tmp_path):
    from hetfed.api import build_federation

    """Two rounds with the mean reported save (w_1 + w_2)/2 — w_1 from a run of one round, w_2 from a run that
    reports its last iterate — and its final accuracies (global, clients') are that saved model's."""
    w1, _, _ = _final_model(tmp_path, "one", 1, False)
    w2, _, _ = _final_model(tmp_path, "last", 2, False)
    mean, model, opened = _final_model(tmp_path, "mean", 2, True)
    for k, v in mean.items():
        torch.testing.assert_close(v, (w1[k] + w2[k]) / 2, rtol=1e-6, atol=1e-7)
        assert not torch.equal(v, w2[k])
    fed = build_federation(opened.config)
    x, y = fed.global_test()
    final = opened.summary["methods"]["agn"]["final"]
    assert final["global_accuracy"] == pytest.approx(float((model.predict(x) == y).mean()), abs=1e-12)
    # the clients scored the same model on their own test sets
    own = [fed.client_data(k, "test") for k in range(fed.n_clients)]
    accuracy = np.mean([(model.predict(xk) == yk).mean() for xk, yk in own])
    assert final["local_accuracy_mean"] == pytest.approx(float(accuracy), abs=1e-12)


@pytest.fixture(scope="module")
def lambda_run(tmp_path_factory):
    """One run of Agnostic FL (3 rounds, the mean reported) that the tests of what it writes about λ read: the
    directory it wrote and the run opened."""
    root = tmp_path_factory.mktemp("agnostic")
    _, _, opened = _final_model(root, "lam", 3, True)
    return root / "lam", opened


def test_a_run_writes_where_lambda_stands_every_round_and_the_last_in_its_summary(lambda_run):
    """λ is what the minimax learns about the clients: every round's ``lambda_*`` in metrics.csv (``train`` rows),
    K effective clients at the uniform start and fewer as λ moves, the last round's in the summary and runs.csv;
    each client's λ_k too (a ``train`` row a client, the summary's ``client_findings``), on the simplex every round
    and agreeing with the summarised figures."""
    import csv

    from hetfed.runs.sweep_tables import run_values

    run_dir, opened = lambda_run
    rows: dict[str, dict[int, float]] = {}
    each: dict[int, dict[int, float]] = {}  # round → client → λ_k
    with open(run_dir / "metrics.csv") as fh:
        for r in csv.DictReader(fh):
            if r["metric"].startswith("lambda_"):
                assert (r["split"], r["client"]) == ("train", "all")
                rows.setdefault(r["metric"], {})[int(r["round"])] = float(r["value"])
            elif r["metric"] == "lambda":
                assert r["split"] == "train"
                each.setdefault(int(r["round"]), {})[int(r["client"])] = float(r["value"])
    assert sorted(each) == [1, 2, 3] and all(sorted(lam) == [0, 1, 2, 3] for lam in each.values())
    for r, lam in each.items():
        values = np.array([lam[k] for k in range(4)])
        assert values.min() >= 0 and values.sum() == pytest.approx(1.0, abs=1e-12)
        assert (values.max(), values.min()) == (rows["lambda_max"][r], rows["lambda_min"][r])
        assert int(np.argmax(values)) == rows["lambda_top_client"][r]
        assert 1 / (values**2).sum() == pytest.approx(rows["lambda_clients"][r], rel=1e-12)
    assert opened.summary["methods"]["agn"]["client_findings"] == {"lambda": [each[3][k] for k in range(4)]}
    assert set(rows) == {"lambda_max", "lambda_min", "lambda_top_client", "lambda_clients"}
    assert all(sorted(v) == [1, 2, 3] for v in rows.values())
    assert all(0 <= rows["lambda_min"][r] <= 0.25 <= rows["lambda_max"][r] <= 1 for r in (1, 2, 3))  # 4 clients
    assert all(1 <= rows["lambda_clients"][r] < 4 for r in (1, 2, 3))  # moved off the uniform 1/4 each
    assert rows["lambda_top_client"][3] in (0.0, 1.0, 2.0, 3.0)
    found = opened.summary["methods"]["agn"]["findings"]
    assert found == {k: v[3] for k, v in rows.items()}
    listed = {k: v for _, k, v in run_values(opened.summary)}
    assert listed["findings.lambda_clients"] == found["lambda_clients"]


def test_the_report_draws_each_clients_lambda_round_by_round(lambda_run):
    """The report's *what the server found about each client*: λ_k of every client and round as the heat map's
    cells (read from metrics.csv as a user's pandas would), kept as figures/client_findings.png;
    ``Run.client_findings`` gives the same table, and refuses a finding or method it does not hold in one line."""
    import pandas as pd

    from hetfed.analysis.report import read_metrics, write_report
    from hetfed.analysis.results import client_findings
    from hetfed.api import open_run
    from hetfed.errors import ConfigError

    run_dir, _ = lambda_run
    grids = client_findings(read_metrics(run_dir / "metrics.csv"))
    assert list(grids) == [("lambda", "agn")]
    rounds, clients, values = grids["lambda", "agn"]
    df = pd.read_csv(run_dir / "metrics.csv")
    lam = df[(df["metric"] == "lambda") & (df["split"] == "train")]
    expected = lam.pivot(index="client", columns="round", values="value").astype(float)
    assert (rounds, clients) == ([1, 2, 3], [0, 1, 2, 3])
    np.testing.assert_array_equal(values, expected.loc[[str(c) for c in clients], rounds].to_numpy())
    assert np.allclose(values.sum(0), 1.0)  # each round's λ on the simplex
    table = open_run(run_dir).client_findings("lambda")  # the same, clients × rounds, for a user's pandas
    assert list(table.index) == [0, 1, 2, 3] and list(table.columns) == [1, 2, 3]
    np.testing.assert_array_equal(table.to_numpy(), values)
    with pytest.raises(ConfigError, match=r"finding 'lambda_max' .* expected one of \['lambda'\]"):
        open_run(run_dir).client_findings("lambda_max")
    with pytest.raises(ConfigError, match=r"method = 'fedavg': finding 'lambda' was found by \['agn'\]"):
        open_run(run_dir).client_findings("lambda", method="fedavg")

    html = write_report(run_dir).read_text()
    assert "what the server found about each client" in html and "figure not drawn" not in html
    assert (run_dir / "figures" / "client_findings.png").stat().st_size > 0
