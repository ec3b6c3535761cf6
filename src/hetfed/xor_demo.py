"""``hetfed demo xor``: the CGAU paper's Appendix A.

XOR of four Gaussian blobs at (±1, ±1), split over two clients: "up" holds the
points with x₂ > 0, "down" those with x₂ < 0. Each client alone is linearly
separable, but by *opposite* rules (up: class = [x₁ > 0]; down: class = [x₁ < 0]).
FedAvg trains (a) an MLP with 2 hidden ReLU units and (b) a CGAU network with one
gated unit, whose per-client filter and gate shifts let each client re-purpose
the same unit. Turning the conditioning off (each kind, then both) shows what
it does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from hetfed.algorithms import build_algorithm
from hetfed.config import ModelConfig, OptimizerConfig, TrainConfig
from hetfed.engine.types import split_state
from hetfed.errors import ConfigError
from hetfed.executors.simulate import simulate
from hetfed.models import build_model
from hetfed.models.cgau import CGAUNet
from hetfed.partition import Federation
from hetfed.runs.rundir import FIGURES, SUMMARY, new_run_dir, write_json_atomic

CLIENTS = ("up", "down")


def xor_federation(n_per_blob: int = 100, std: float = 0.3, seed: int = 0) -> Federation:
    """Two clients, up (x₂ > 0) and down (x₂ < 0); 60/20/20 train/val/test each."""
    rng = np.random.default_rng(seed)
    centres = np.array([[1, 1], [-1, 1], [1, -1], [-1, -1]], dtype=np.float32)
    x = np.concatenate([c + std * rng.normal(size=(n_per_blob, 2)) for c in centres]).astype(np.float32)
    x[:, 1] = np.where(np.repeat(centres[:, 1], n_per_blob) > 0, np.abs(x[:, 1]), -np.abs(x[:, 1]))
    y = ((x[:, 0] > 0) ^ (x[:, 1] > 0)).astype(np.int64)
    splits = []
    for side in (x[:, 1] > 0, x[:, 1] <= 0):
        idx = rng.permutation(np.flatnonzero(side))
        a, b = int(0.6 * len(idx)), int(0.8 * len(idx))
        splits.append((np.sort(idx[:a]), np.sort(idx[a:b]), np.sort(idx[b:])))
    test_all = np.concatenate([s[2] for s in splits])
    return Federation(
        x=x, y=y,
        train=tuple(s[0] for s in splits), val=tuple(s[1] for s in splits), test=tuple(s[2] for s in splits),
        x_global_test=x[test_all], y_global_test=y[test_all], n_classes=2,
        opted_out=np.zeros(2, dtype=bool), input_shape=(2,), kind="xor",
    )


def _train(model_cfg: ModelConfig, fed: Federation, seed: int, rounds: int):
    # full-batch steps: a one-unit network is easily knocked into a poor optimum by
    # minibatch noise (lr 0.05, 2 steps per round solved 6 of 6 seeds; minibatches 2 of 3)
    train = TrainConfig(
        rounds=rounds, local_steps=2, batch_size=1000, eval_every=rounds,
        optimizer=OptimizerConfig(kind="adam", lr=0.05, reset_each_round=False),
    )
    model = build_model(model_cfg, fed.input_shape, fed.n_classes)
    algo = build_algorithm("fedavg", model, train)
    return model, algo, simulate(algo, fed, train, seed)


def _client_params(algo, result, k: int, filter_cond: bool = True, gate_cond: bool = True) -> dict[str, torch.Tensor]:
    params = {**result.server.params, **split_state(result.states[k])[0]}
    for name in list(params):
        if (name.endswith("filter.cond") and not filter_cond) or (name.endswith("gate.cond") and not gate_cond):
            params[name] = torch.zeros_like(params[name])
    return {n: v.unsqueeze(0) for n, v in params.items()}


def _accuracy(model, params, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        logits = model.forward(params, torch.as_tensor(x).unsqueeze(0))[0]
    return float((logits.argmax(-1).numpy() == y).mean())


def run_xor_demo(out: str | Path | None = None, seed: int = 0, rounds: int = 150) -> tuple[Path, dict]:
    """Train both models, write figures and summary.json; return (dir, summary). Bad ``rounds`` or ``seed`` is
    refused before anything is written."""
    for name, value, least in (("rounds", rounds, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"--{name} {value!r} is not allowed: expected an integer ≥ {least}")
    fed = xor_federation(seed=seed)
    out_dir = new_run_dir(out, "runs", "demo-xor")
    summary: dict = {"seed": seed, "rounds": rounds, "models": {}}
    trained = {}
    for name, cfg in (("mlp_2_hidden", ModelConfig(kind="mlp", hidden=[2])),
                      ("cgau_1_unit", ModelConfig(kind="cgau", hidden=[1], dropout=0.0))):
        model, algo, result = _train(cfg, fed, seed, rounds)
        trained[name] = (model, algo, result)
        entry: dict = {}
        for k, client in enumerate(CLIENTS):
            test = fed.test[k]
            row = {"accuracy": _accuracy(model, _client_params(algo, result, k), fed.x[test], fed.y[test])}
            if isinstance(model, CGAUNet):
                for label, f, g in (("no_filter_cond", False, True), ("no_gate_cond", True, False),
                                    ("no_cond", False, False)):
                    row[f"accuracy_{label}"] = _accuracy(model, _client_params(algo, result, k, f, g), fed.x[test],
                                                         fed.y[test])
            entry[client] = row
        summary["models"][name] = entry
    _figures(fed, trained, out_dir)
    write_json_atomic(out_dir / SUMMARY, summary)
    return out_dir, summary


def _figures(fed: Federation, trained: dict, out_dir: Path) -> None:
    from hetfed.analysis.figures import plt, save

    grid = np.linspace(-2.2, 2.2, 200, dtype=np.float32)
    gx, gy = np.meshgrid(grid, grid)
    pts = torch.as_tensor(np.stack([gx.ravel(), gy.ravel()], 1)).unsqueeze(0)
    fig_dir = out_dir / FIGURES
    fig_dir.mkdir(parents=True, exist_ok=True)

    def boundary(ax, model, params, title, k):
        with torch.no_grad():
            prob = model.forward(params, pts)[0].softmax(-1)[:, 1].numpy().reshape(gx.shape)
        ax.contourf(gx, gy, prob, levels=20, cmap="RdBu_r", alpha=0.6)
        ax.contour(gx, gy, prob, levels=[0.5], colors="k")
        idx = fed.client_indices(k)
        ax.scatter(fed.x[idx, 0], fed.x[idx, 1], c=fed.y[idx], cmap="bwr", s=6, edgecolors="none")
        ax.set_title(title, fontsize=9)
        ax.set_xticks([])
        ax.set_yticks([])

    # decision boundaries of both models, per client
    fig, axes = plt.subplots(2, 2, figsize=(8, 8))
    for row, (name, (model, algo, result)) in enumerate(trained.items()):
        for k, client in enumerate(CLIENTS):
            boundary(axes[row, k], model, _client_params(algo, result, k), f"{name} · client {client}", k)
    save(fig, fig_dir / "decision_boundaries.png", dpi=100)

    model, algo, result = trained["cgau_1_unit"]
    # boundaries with each kind of conditioning turned off
    variants = (("conditioned", True, True), ("filter cond off", False, True), ("gate cond off", True, False),
                ("all cond off", False, False))
    fig, axes = plt.subplots(2, 4, figsize=(16, 8))
    for k, client in enumerate(CLIENTS):
        for j, (label, f, g) in enumerate(variants):
            boundary(axes[k, j], model, _client_params(algo, result, k, f, g), f"client {client} · {label}", k)
    save(fig, fig_dir / "cgau_conditioning_off.png", dpi=100)

    # filter and gate activations over the plane, with and without conditioning
    fig, axes = plt.subplots(2, 4, figsize=(16, 8))
    for k, client in enumerate(CLIENTS):
        for j, cond in enumerate((True, False)):
            with torch.no_grad():
                (f, g), = model.units(_client_params(algo, result, k, cond, cond), pts)
            for m, (act, label) in enumerate(((f, "filter tanh"), (g, "gate σ"))):
                ax = axes[k, 2 * j + m]
                im = ax.contourf(gx, gy, act[0, :, 0].numpy().reshape(gx.shape), levels=20, cmap="viridis")
                ax.set_title(f"client {client} · {label} · {'with' if cond else 'without'} cond", fontsize=9)
                ax.set_xticks([])
                ax.set_yticks([])
                fig.colorbar(im, ax=ax)
    save(fig, fig_dir / "cgau_filter_gate.png", dpi=100)
