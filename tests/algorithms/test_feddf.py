"""FedDF (Lin et al. 2020) against the paper: average, then distil the clients' mean logits into the
average on unlabeled server data with Adam and T²·KL; server data held out or from another dataset."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hetfed.algorithms import build_algorithm
from hetfed.algorithms.feddf import FedDFParams as FedDFConfig
from hetfed.cli import main
from hetfed.config import ModelConfig, PartitionConfig, TrainConfig, build_config
from hetfed.engine.rng import SERVER_INIT, torch_gen
from hetfed.engine.types import stack_states
from hetfed.executors.inprocess import Pool, SequentialExecutor, VectorisedExecutor, client_data
from hetfed.executors.simulate import simulate
from hetfed.models import build_model
from hetfed.partition import make_federation
from hetfed.pipeline import prepare
from tests.synthetic import ShiftedGaussians


def _dataset():
    return ShiftedGaussians(n=300, d=4, classes=3)


def _fed(server=40):
    from dataclasses import replace

    fed = make_federation(_dataset(), PartitionConfig(kind="dirichlet", clients=6, alpha=0.5, min_size=8), 0)
    server_x = np.random.default_rng(9).normal(size=(server, 4)).astype(np.float32) + 1
    return replace(fed, server_x=server_x)


def _algo(kind="logreg", **cfg):
    fed = _fed()
    train = TrainConfig(rounds=3, local_steps=3, batch_size=8, eval_every=3,
                        optimizer={"kind": "sgd", "lr": 0.1, "momentum": 0.0})
    model = build_model(ModelConfig(kind=kind, **({"hidden": [8]} if kind == "mlp" else {})), fed.input_shape,
                        fed.n_classes)
    return fed, train, build_algorithm("feddf", model, train, FedDFConfig(**cfg))


def test_one_round_equals_the_papers_distillation_written_here():
    """θ₀ = Σ n_k θ_k / Σ n_k; teacher = (1/K) Σ_k x W_k + b_k; Adam(1e-3) on T²·KL(σ(teacher/T) ‖ σ(student/T))
    over all server samples (one full batch per step), 7 steps, no early stopping."""
    fed, train, algo = _algo(batch_size=10_000, max_steps=7, val_fraction=0.0, temperature=2.0, lr=0.01)
    algo.bind(fed, 0, 6)
    server = algo.server_init(torch_gen(0, SERVER_INIT))
    ids = list(range(6))
    pool = Pool(torch.as_tensor(fed.x), torch.as_tensor(fed.y), fed.train, 0, fed.val)
    states = stack_states([algo.client_init(k, torch_gen(0, 3, k)) for k in ids])
    upload, _ = algo.local_update(algo.broadcast(server, 0), states, client_data(pool, ids, 0))
    new = algo.aggregate(server, upload)

    Wk, bk = upload.params["layers.0.weight"].double(), upload.params["layers.0.bias"].double()
    n = upload.num_samples.double()
    W = (n[:, None, None] * Wk).sum(0) / n.sum()
    b = (n[:, None] * bk).sum(0) / n.sum()
    X = torch.as_tensor(fed.server_x).double()
    teacher = torch.stack([X @ Wk[k] + bk[k] for k in ids]).mean(0)
    W, b = W.clone().requires_grad_(True), b.clone().requires_grad_(True)
    opt = torch.optim.Adam([W, b], lr=0.01)
    T = 2.0
    for _ in range(7):
        p_t = F.softmax(teacher / T, -1)
        loss = (p_t * (F.log_softmax(teacher / T, -1) - F.log_softmax((X @ W + b) / T, -1))).sum(-1).mean() * T * T
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.testing.assert_close(new.params["layers.0.weight"].double(), W.detach(), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(new.params["layers.0.bias"].double(), b.detach(), rtol=1e-4, atol=1e-5)
    assert new.extra["distill_steps"] == 7
    assert set(upload.extra) == {"train_loss"}  # FedDF sends what FedAvg sends


def test_early_stopping_keeps_the_student_closest_to_the_ensemble_on_held_out_server_data():
    fed, train, algo = _algo(max_steps=400, patience=50, eval_every=10, lr=0.5)  # a large lr overshoots: stops
    res = simulate(algo, fed, train, seed=0)
    assert 0 < res.server.extra["distill_steps"] <= 400


def _distillation(kind: str, seed: int) -> tuple:
    """One run's FedDF server after a round of its clients: (algorithm, server state, upload)."""
    fed, train, algo = _algo(kind, max_steps=150, patience=30, eval_every=10, lr=0.001)
    algo.bind(fed, seed, 6)
    server = algo.server_init(torch_gen(seed, SERVER_INIT))
    pool = Pool(torch.as_tensor(fed.x), torch.as_tensor(fed.y), fed.train, 0, fed.val)
    states_k = stack_states([algo.client_init(k, torch_gen(seed, 3, k)) for k in range(6)])
    upload, _ = algo.local_update(algo.broadcast(server, 0), states_k, client_data(pool, list(range(6)), seed))
    return algo, server, upload


def _stopping_apart(steps: dict[int, int]) -> list[int]:
    """Three seeds whose runs stop at three different steps, one of them running to ``max_steps`` (150): where each
    stops is float rounding's (AMD EPYC: logreg seeds 0, 1, 3 at 140, 150, 90; an Intel Xeon: 140, 140, 130), so the
    seeds are chosen from what this machine computes."""
    full = [s for s, n in steps.items() if n == 150]
    early = {n: s for s, n in steps.items() if n < 150}
    assert full and len(early) >= 2, steps
    return [full[0], *list(early.values())[:2]]


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
def test_runs_distilled_in_one_stack_give_each_runs_numbers_alone_where_they_stop_at_different_steps(kind):
    """#74 §1: a stacked sweep's FedDF servers distil their runs' students together (``aggregate_runs``); each run
    keeps its own batches, early stopping and Adam state, so its student and steps are the run's alone, to the bit —
    with the seeds' runs stopping early at two different steps and one running to ``max_steps``."""
    runs = {seed: _distillation(kind, seed) for seed in range(8)}
    stops = {seed: a.aggregate(s, u).extra["distill_steps"] for seed, (a, s, u) in runs.items()}
    algos, states, uploads = zip(*(runs[seed] for seed in _stopping_apart(stops)), strict=True)
    alone = [a.aggregate(s, u) for a, s, u in zip(algos, states, uploads, strict=True)]
    steps = [r.extra["distill_steps"] for r in alone]
    assert len(set(steps)) == 3 and max(steps) == 150, steps
    groups = {a.aggregate_key(s, u) for a, s, u in zip(algos, states, uploads, strict=True)}
    assert len(groups) == 1
    together = type(algos[0]).aggregate_runs(algos, states, uploads)
    for a, b in zip(alone, together, strict=True):
        assert a.extra["distill_steps"] == b.extra["distill_steps"]
        for k in a.params:
            assert torch.equal(a.params[k], b.params[k]), k


@pytest.mark.parametrize("kind", ["logreg", "mlp"])
def test_executors_agree(kind):
    runs = []
    for executor in (VectorisedExecutor(), SequentialExecutor()):
        fed, train, algo = _algo(kind, max_steps=30, eval_every=10)
        runs.append(simulate(algo, fed, train, seed=1, executor=executor))
    a, b = runs
    for k in a.server.params:
        torch.testing.assert_close(a.server.params[k], b.server.params[k], rtol=1e-5, atol=1e-6)


def test_server_data_is_held_out_before_partitioning_and_carries_no_labels():
    cfg = build_config({"methods": [{"algorithm": "feddf"}], "server_data": {"fraction": 0.2}})
    prep = prepare(cfg, progress=False)
    fed = prep.federation
    n_pool = len(prep.data.y_train)
    assert len(fed.server_x) == round(0.2 * n_pool) and len(fed.y) == n_pool - len(fed.server_x)
    held = {row.tobytes() for row in fed.server_x}
    assert not held & {row.tobytes() for row in fed.x[np.concatenate(fed.train)]}
    plain = prepare(build_config({}), progress=False).federation  # no FedDF: nothing held out (auto)
    assert plain.server_x is None and len(plain.y) == n_pool


def test_feddf_without_server_data_or_with_a_mismatched_dataset_fails_before_training(tmp_path, capsys):
    out = tmp_path / "r"
    code = main(["run", "--set", "methods.0.algorithm=feddf", "--set", "server_data.source=none", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "server_data.source" in err and "feddf" in err and not out.exists()
    from hetfed.data.formats import write_idx
    from tests.test_user_facing import write_mnist_like

    write_mnist_like(tmp_path / "same")  # 8×8 images: the digits federation's 64 features
    other = build_config({"methods": [{"algorithm": "feddf"}], "server_data": {
        "source": "dataset", "name": "mnist", "data_dir": str(tmp_path / "same")}})
    fed = prepare(other, progress=False).federation
    assert fed.server_x.shape == (120, 64) and len(fed.y) == len(prepare(build_config({}), progress=False).federation.y)
    wide = tmp_path / "wide"
    wide.mkdir()
    for prefix, n in (("train", 30), ("t10k", 10)):
        write_idx(wide / f"{prefix}-images-idx3-ubyte.gz", np.zeros((n, 10, 10), dtype=np.uint8))
        write_idx(wide / f"{prefix}-labels-idx1-ubyte.gz", (np.arange(n) % 10).astype(np.uint8))
    code = main(["run", "--set", "methods.0.algorithm=feddf", "--set", "server_data.source=dataset",
                 "--set", "server_data.name=mnist", "--set", f"server_data.data_dir={wide}", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "server_data.name" in err and "(100,)" in err and "(64,)" in err and not out.exists()
