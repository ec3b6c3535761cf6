"""Server optimisers (#24): each against a hand computation of its paper's update equations over 3 rounds,
the pipeline's order (combine → optimiser), and every algorithm with a server model running under them.

The reference below is written from the papers, in NumPy float64, not from hetfed's code:
- FedAvgM, Hsu, Qi, Brown 2019 ("Measuring the effects of non-identical data distribution for federated
  visual classification", §3): v ← βv + Δ, x ← x + ηv (Δ: the average client model minus the global one);
- FedAdagrad / FedAdam / FedYogi, Reddi et al. 2021 ("Adaptive Federated Optimization", Algorithm 2):
  m ← β₁m + (1−β₁)Δ; v ← v + Δ² | β₂v + (1−β₂)Δ² | v − (1−β₂)Δ²·sign(v − Δ²); x ← x + η m/(√v + τ),
  with m₋₁ = 0 and v₋₁ = τ² (the paper requires v₋₁ ≥ τ²);
- Kingma & Ba's bias correction (``bias_correction``): the same with v₋₁ = 0 and η_t = η·√(1−β₂ᵗ)/(1−β₁ᵗ);
- Flower's own strategies (``variant: flower``): driven through Flower's classes, not a formula (below).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetfed.config import ServerConfig, build_config
from hetfed.engine.types import Upload
from hetfed.errors import ConfigError
from hetfed.server.chain import DECIDED
from hetfed.server.pipeline import server_chain
from tests.flower_strategy import Nodes, flower_task  # noqa: F401  (the fixture, by name)


def reference(kind: str, x0: np.ndarray, rounds: list[tuple[np.ndarray, np.ndarray]], lr: float, beta1=0.9,
              beta2=0.99, tau=1e-3, momentum=0.9, flower=False) -> list[np.ndarray]:
    """x after each round; a round is (client models [n, d], sample counts [n])."""
    x = x0.astype(np.float64).copy()
    m = np.zeros_like(x)
    v = np.zeros_like(x) if (flower or kind == "avgm") else np.full_like(x, tau**2)
    out = []
    for t, (models, counts) in enumerate(rounds, start=1):
        w = counts / counts.sum()
        delta = (w[:, None] * models).sum(0) - x
        if kind == "sgd":
            x = x + lr * delta
        elif kind == "avgm":
            v = momentum * v + delta
            x = x + lr * v
        else:
            m = beta1 * m + (1 - beta1) * delta
            if kind == "adagrad":
                v = v + delta**2
            elif kind == "adam":
                v = beta2 * v + (1 - beta2) * delta**2
            else:
                v = v - (1 - beta2) * delta**2 * np.sign(v - delta**2)
            eta = lr * np.sqrt(1 - beta2**t) / (1 - beta1**t) if flower else lr
            x = x + eta * m / (np.sqrt(v) + tau)
        out.append(x.copy())
    return out


def _rounds(seed: int, d: int = 5, n: int = 4):
    rng = np.random.default_rng(seed)
    return [(rng.normal(size=(n, d)), rng.integers(1, 20, size=n).astype(np.float64)) for _ in range(3)]


@pytest.mark.parametrize("kind,lr", [("sgd", 0.7), ("avgm", 0.5), ("adagrad", 0.1), ("adam", 0.1), ("yogi", 0.1)])
def test_each_optimiser_follows_its_papers_equations_over_three_rounds(kind, lr):
    x0 = np.random.default_rng(1).normal(size=5)
    rounds = _rounds(2)
    expected = reference(kind, x0, rounds, lr)
    pipe = server_chain(ServerConfig(optimizer={"kind": kind, "lr": lr}))
    params, state = {"w": torch.tensor(x0, dtype=torch.float64)}, {}
    for (models, counts), want in zip(rounds, expected, strict=True):
        up = Upload([0, 1, 2, 3], {"w": torch.tensor(models)}, torch.tensor(counts))
        params, state = pipe.step(params, up, state)
        np.testing.assert_allclose(params["w"].numpy(), want, rtol=1e-10, atol=1e-12)


def test_kingmas_bias_corrected_fedadam_is_the_option():
    x0 = np.zeros(5)
    rounds = _rounds(3)
    expected = reference("adam", x0, rounds, 0.1, flower=True)
    pipe = server_chain(ServerConfig(optimizer={"kind": "adam", "lr": 0.1, "bias_correction": True}))
    params, state = {"w": torch.tensor(x0)}, {}
    for (models, counts), want in zip(rounds, expected, strict=True):
        params, state = pipe.step(params, Upload([0, 1, 2, 3], {"w": torch.tensor(models)}, torch.tensor(counts)),
                                  state)
        np.testing.assert_allclose(params["w"].numpy(), want, rtol=1e-10)
    assert not np.allclose(expected[-1], reference("adam", x0, rounds, 0.1)[-1])  # the two differ


def test_sgd_at_lr_one_is_the_average_itself_bit_for_bit():
    models = torch.randn(3, 7)
    counts = torch.tensor([3.0, 5.0, 9.0])
    up = Upload([0, 1, 2], {"w": models}, counts)
    new, state = server_chain(ServerConfig()).step({"w": torch.zeros(7)}, up, {})
    assert torch.equal(new["w"], torch.tensordot(counts / counts.sum(), models, dims=1))
    # the mean keeps nothing between rounds but what it gave each update this round
    assert list(state) == [DECIDED] and torch.equal(state[DECIDED]["weights"], counts / counts.sum())


def test_the_optimiser_moves_the_robust_aggregate_not_the_mean():
    """combine → optimiser: with the median, Δ is the coordinate-wise median minus the global model."""
    models = torch.tensor([[0.0], [1.0], [100.0]], dtype=torch.float64)
    pipe = server_chain(ServerConfig(combine={"rule": "median"},
                                     optimizer={"kind": "avgm", "lr": 0.5, "momentum": 0.0}))
    new, _ = pipe.step({"w": torch.zeros(1, dtype=torch.float64)}, Upload([0, 1, 2], {"w": models}, torch.ones(3)), {})
    assert new["w"].item() == pytest.approx(0.5)  # 0 + 0.5 · (median 1 − 0)


def test_old_server_lr_still_works_with_a_note_and_means_server_lr():
    with pytest.warns(UserWarning, match=r"train.server_lr is deprecated: it is now server.optimizer.lr"):
        cfg = build_config({"train": {"server_lr": 0.5}})
    assert cfg.server.optimizer.lr == 0.5 and cfg.server.optimizer.effective_lr == 0.5


@pytest.mark.parametrize("algorithm,model", [("fedavg", "mlp"), ("fedprox", "mlp"), ("scaffold", "mlp"),
                                             ("fedavg", "cgau"), ("fsnet", "mlp")])
def test_fedadam_runs_with_every_algorithm_with_a_server_model(tmp_path, algorithm, model):
    """FedAdam on FedAvg, FedProx, SCAFFOLD, CGAU and Fed-FSNet: it changes the result, and its state is kept."""
    from hetfed.runs.runner import run_experiment

    def run(server: dict, out: str) -> dict:
        cfg = build_config({"partition": {"clients": 4}, "train": {"rounds": 3, "local_steps": 2},
                            "server": server, "methods": [{"algorithm": algorithm, "model": {"kind": model},
                                                            "params": {"server_steps": 3} if algorithm == "fsnet"
                                                            else {}}]})
        return run_experiment(cfg, out=tmp_path / out, progress=False).summary["methods"][algorithm]

    adam, plain = run({"optimizer": {"kind": "adam", "lr": 0.05}}, "adam"), run({}, "sgd")
    key = "server_loss" if model == "cgau" else "global_loss"  # CGAU's server model: zero conditioning
    assert np.isfinite(adam["final"][key])
    assert adam["final"][key] != plain["final"][key]


# ------------------------------------------------------------------ Flower's own strategy classes (#45)


def _flower_strategy(kind: str, lr: float, n: int):
    from flwr.serverapp import strategy

    common = {"min_available_nodes": n, "min_train_nodes": n}
    if kind == "avgm":
        return strategy.FedAvgM(server_learning_rate=lr, server_momentum=0.9, **common)
    if kind == "adagrad":  # Flower's FedAdagrad takes no β₁ (it is 0) and no β₂
        return strategy.FedAdagrad(eta=lr, tau=1e-3, **common)
    cls = {"adam": strategy.FedAdam, "yogi": strategy.FedYogi}[kind]
    return cls(eta=lr, beta_1=0.9, beta_2=0.99, tau=1e-3, **common)


def _flower_rounds(kind: str, lr: float, x0: np.ndarray, rounds) -> list[np.ndarray]:
    """x after each round, computed by Flower's own strategy class from the same replies."""
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

    n = len(rounds[0][1])
    flwr_strategy, out = _flower_strategy(kind, lr, n), []
    arrays = ArrayRecord({"w": Array(x0.copy())})
    for r, (models, counts) in enumerate(rounds, start=1):
        instructions = list(flwr_strategy.configure_train(r, arrays, ConfigRecord(), Nodes(n)))
        replies = [Message(RecordDict({"arrays": ArrayRecord({"w": Array(models[i].copy())}),
                                       "metrics": MetricRecord({"num-examples": int(counts[i])})}), reply_to=msg)
                   for i, msg in enumerate(instructions)]
        arrays, _ = flwr_strategy.aggregate_train(r, replies)
        out.append(arrays["w"].numpy().copy())
    return out


@pytest.mark.parametrize("lr", [0.03, 0.1])
@pytest.mark.parametrize("kind", ["adagrad", "adam", "yogi", "avgm"])
def test_variant_flower_reproduces_flowers_own_strategy_classes(flower_task, kind, lr):  # noqa: F811
    """Fed the same replies for 4 rounds, Flower 1.42's FedAdagrad / FedAdam / FedYogi / FedAvgM and hetfed's
    ``server.optimizer.variant: flower`` give the same global model. hetfed's default (the papers) differs for the
    adaptive three: that is what the variant is for."""
    rng = np.random.default_rng(7)
    x0 = rng.normal(size=6)
    rounds = [(x0 + rng.normal(scale=0.5, size=(4, 6)) * (r + 1), rng.integers(1, 50, size=4).astype(np.float64))
              for r in range(4)]
    want = _flower_rounds(kind, lr, x0, rounds)

    def hetfed_rounds(**server) -> list[np.ndarray]:
        pipe = server_chain(ServerConfig(optimizer={"kind": kind, "lr": lr, **server}))
        params, state, out = {"w": torch.tensor(x0)}, {}, []
        for models, counts in rounds:
            params, state = pipe.step(params, Upload([0, 1, 2, 3], {"w": torch.tensor(models)}, torch.tensor(counts)),
                                      state)
            out.append(params["w"].numpy().copy())
        return out

    for got, expected in zip(hetfed_rounds(variant="flower"), want, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)
    paper = hetfed_rounds()
    if kind == "avgm":  # Hsu et al.'s FedAvgM is Flower's
        np.testing.assert_allclose(paper[-1], want[-1], rtol=1e-9, atol=1e-12)
    else:
        assert np.abs(paper[-1] - want[-1]).max() > 1e-4


def test_flowers_fedadam_takes_0_742_of_eta_in_its_first_round():
    """√(1 − 0.99²)/(1 − 0.9²) = 0.7425…: Flower counts rounds from 1 and raises β to the round + 1."""
    from hetfed.server.optimizers import optimizer_for

    opt = optimizer_for(ServerConfig(optimizer={"kind": "adam", "lr": 1.0, "variant": "flower"}))
    delta = torch.tensor([0.5])
    new, _ = opt.update({"w": torch.zeros(1, dtype=torch.float64)}, {"w": delta.double()}, {})
    m, v = 0.1 * 0.5, 0.01 * 0.25  # (1 − β₁)Δ and (1 − β₂)Δ² from zero moments
    assert new["w"].item() == pytest.approx(np.sqrt(1 - 0.99**2) / (1 - 0.9**2) * m / (np.sqrt(v) + 1e-3))
    assert np.sqrt(1 - 0.99**2) / (1 - 0.9**2) == pytest.approx(0.7425, abs=1e-4)


def test_flowers_variant_and_kingmas_bias_correction_are_refused_together():
    with pytest.raises(ConfigError, match=r"server.optimizer.bias_correction = true is not allowed with "
                                          r"server.optimizer.variant"):
        build_config({"server": {"optimizer": {"kind": "adam", "variant": "flower", "bias_correction": True}}})
