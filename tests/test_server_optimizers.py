"""Server optimisers (#24): each against a hand computation of its paper's update equations over 3 rounds,
the pipeline's order (combine → optimiser), and every algorithm with a server model running under them.

The reference below is written from the papers, in NumPy float64, not from hetfed's code:
- FedAvgM, Hsu, Qi, Brown 2019 ("Measuring the effects of non-identical data distribution for federated
  visual classification", §3): v ← βv + Δ, x ← x + ηv (Δ: the average client model minus the global one);
- FedAdagrad / FedAdam / FedYogi, Reddi et al. 2021 ("Adaptive Federated Optimization", Algorithm 2):
  m ← β₁m + (1−β₁)Δ; v ← v + Δ² | β₂v + (1−β₂)Δ² | v − (1−β₂)Δ²·sign(v − Δ²); x ← x + η m/(√v + τ),
  with m₋₁ = 0 and v₋₁ = τ² (the paper requires v₋₁ ≥ τ²);
- Flower's FedAdam: the same with v₋₁ = 0 and η_t = η·√(1−β₂ᵗ)/(1−β₁ᵗ).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetfed.config import ServerConfig, TrainConfig, build_config
from hetfed.engine.types import Upload
from hetfed.server.pipeline import pipeline_for


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
    pipe = pipeline_for(TrainConfig(), ServerConfig(optimizer=kind, lr=lr))
    params, state = {"w": torch.tensor(x0, dtype=torch.float64)}, {}
    for (models, counts), want in zip(rounds, expected, strict=True):
        up = Upload([0, 1, 2, 3], {"w": torch.tensor(models)}, torch.tensor(counts))
        params, state = pipe.step(params, up, state)
        np.testing.assert_allclose(params["w"].numpy(), want, rtol=1e-10, atol=1e-12)


def test_flowers_bias_corrected_fedadam_is_the_option():
    x0 = np.zeros(5)
    rounds = _rounds(3)
    expected = reference("adam", x0, rounds, 0.1, flower=True)
    pipe = pipeline_for(TrainConfig(), ServerConfig(optimizer="adam", lr=0.1, bias_correction=True))
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
    new, state = pipeline_for(TrainConfig(), ServerConfig()).step({"w": torch.zeros(7)}, up, {})
    assert torch.equal(new["w"], torch.tensordot(counts / counts.sum(), models, dims=1)) and state == {}


def test_the_optimiser_moves_the_robust_aggregate_not_the_mean():
    """combine → optimiser: with the median, Δ is the coordinate-wise median minus the global model."""
    models = torch.tensor([[0.0], [1.0], [100.0]], dtype=torch.float64)
    pipe = pipeline_for(TrainConfig(aggregator="median"), ServerConfig(optimizer="avgm", lr=0.5, momentum=0.0))
    new, _ = pipe.step({"w": torch.zeros(1, dtype=torch.float64)}, Upload([0, 1, 2], {"w": models}, torch.ones(3)), {})
    assert new["w"].item() == pytest.approx(0.5)  # 0 + 0.5 · (median 1 − 0)


def test_old_server_lr_still_works_with_a_note_and_means_server_lr():
    with pytest.warns(UserWarning, match=r"train.server_lr is deprecated: it is now server.lr"):
        cfg = build_config({"train": {"server_lr": 0.5}})
    assert cfg.server.lr == 0.5 and cfg.server.effective_lr == 0.5


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

    adam, plain = run({"optimizer": "adam", "lr": 0.05}, "adam"), run({}, "sgd")
    key = "server_loss" if model == "cgau" else "global_loss"  # CGAU's server model: zero conditioning
    assert np.isfinite(adam["final"][key])
    assert adam["final"][key] != plain["final"][key]
