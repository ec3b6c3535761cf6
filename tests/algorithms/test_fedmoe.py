import csv
import json
from dataclasses import replace

import numpy as np
import pytest
import torch

from hetfed.algorithms import build_algorithm, resolve_run
from hetfed.cli import main
from hetfed.config import ModelConfig, PartitionConfig, build_config
from hetfed.models import build_model
from hetfed.models.base import under
from hetfed.models.mixture import Mixture
from hetfed.partition import make_federation


class _Data:
    def __init__(self):
        rng = np.random.default_rng(0)
        self.y_train = rng.integers(0, 4, 1200)
        self.x_train = (rng.normal(size=(1200, 8)) + self.y_train[:, None]).astype(np.float32)
        self.y_test = np.repeat(np.arange(4), 25)
        self.x_test = (rng.normal(size=(100, 8)) + self.y_test[:, None]).astype(np.float32)
        self.n_classes = 4
        self.input_shape = (8,)


def _config(**train):
    return build_config({
        "partition": {"kind": "majority", "clients": 10, "p": 0.9, "samples_per_client": 60, "opt_out": 0.5},
        "train": {"rounds": 6, "clients_per_round": 3, "optimizer": {"kind": "adam", "lr": 0.01}, "eval_every": 2,
                  **train},
        "methods": [{"algorithm": "fedmoe", "params": {"max_epochs": 4, "patience": 2}}],
    })


def _run(config, fed):
    """FedMoE through the engine: federated rounds, then the personalisation step, then each view scored."""
    from hetfed.executors.simulate import personalise, simulate

    def build(n_out):
        return build_model(ModelConfig(hidden=[16], dropout=0.2), fed.input_shape, n_out)

    algo = build_algorithm("fedmoe", build(fed.n_classes), config.train, config.methods[0].params, build=build,
                           seed=config.seed)
    run = resolve_run(algo, fed, config.train, config.seed)
    res = personalise(run, fed, simulate(run, fed), torch.device("cpu"))
    out = {}
    for view, ev in res.views.items():
        epochs = res.personal_info.get(f"epochs.{view}")
        out[view] = {"evaluation": ev, "best": ev.metrics, "local_accuracy": ev.metrics["local_accuracy_mean"],
                     "global_accuracy": ev.metrics["global_accuracy"],
                     "epochs_mean": float(np.mean(epochs)) if epochs else None}
    out["fedavg"]["_global_params"] = (res.best_server or res.server).params
    return out


def test_mixture_blends_in_probability_space():
    mix = Mixture(lambda n: build_model(ModelConfig(hidden=[5]), (3,), n), 4)
    gen = torch.Generator().manual_seed(0)
    p = {s.name: s.init(gen, s.shape).unsqueeze(0) for s in mix.specs()}
    x = torch.randn(1, 6, 3)
    f_g = mix.expert.forward(under(p, "global."), x)
    f_s = mix.expert.forward(under(p, "specialist."), x)
    h = mix.gate_value(p, x)
    expected = h * f_s.softmax(-1) + (1 - h) * f_g.softmax(-1)
    torch.testing.assert_close(mix.forward(p, x).exp(), expected)
    p["gate.layers.1.bias"] = torch.full_like(p["gate.layers.1.bias"], 50.0)  # h → 1: the specialist alone
    torch.testing.assert_close(mix.forward(p, x).exp(), f_s.softmax(-1), atol=1e-5, rtol=1e-5)
    log_mix = Mixture(mix.expert.__class__ and (lambda n: build_model(ModelConfig(hidden=[5]), (3,), n)), 4,
                      blend="log")
    torch.testing.assert_close(log_mix.forward(p, x), f_s, atol=1e-4, rtol=1e-4)
    assert all(s.local for s in mix.specs())  # specialist, gate and the global copy stay on the client


def test_opted_out_data_leaves_the_global_model_bit_identical():
    config = _config()
    fed = make_federation(_Data(), config.partition, 0)
    assert fed.opted_out.sum() == 5
    a = _run(config, fed)
    x2 = fed.x.copy()
    for k in np.flatnonzero(fed.opted_out):
        x2[fed.client_indices(k)] = -50.0
    b = _run(config, replace(fed, x=x2))
    ga, gb = a["fedavg"]["_global_params"], b["fedavg"]["_global_params"]
    assert all(torch.equal(ga[k], gb[k]) for k in ga)
    # ... while the opted-out clients' own models did change: they still benefit
    assert a["finetuned"]["local_accuracy"] != b["finetuned"]["local_accuracy"]
    # local accuracy is reported apart for the clients that opted out and those that did not
    for m in ("local", "fedavg", "finetuned", "mixture"):
        acc = np.asarray(a[m]["evaluation"].per_client["local_accuracy"])
        out = fed.opted_out.astype(bool)
        assert a[m]["best"]["local_accuracy_opted_out_mean"] == pytest.approx(acc[out].mean())
        assert a[m]["best"]["local_accuracy_opted_in_mean"] == pytest.approx(acc[~out].mean())


def _stopping_config(train: dict | None = None, **moe):
    """Adam at lr 0.1 and patience 1: clients stop at different epochs."""
    c = _config(**(train or {})).model_dump(mode="json")
    c["methods"][0]["params"] = {"max_epochs": 12, "patience": 1, "optimizer": {"kind": "adam", "lr": 0.1}, **moe}
    return build_config(c)


def test_personalisation_executors_agree():
    fed = make_federation(_Data(), _config().partition, 0)
    seq = _run(_stopping_config({"executor": "sequential"}), fed)
    vec = _run(_stopping_config({"executor": "vectorised"}), fed)
    assert min(vec["local"]["epochs_mean"], vec["mixture"]["epochs_mean"]) < 12  # early stopping did act
    for m in ("local", "fedavg", "finetuned", "mixture"):
        for key in ("local_accuracy", "global_accuracy"):
            assert seq[m][key] == pytest.approx(vec[m][key], abs=1e-6), (m, key)
        for key in ("global_accuracy_own", "global_accuracy_other", "gate_own", "gate_other"):
            assert (
                (key in seq[m]["best"])
                == (key in vec[m]["best"])
                == (m == "mixture" or "gate" not in key and m != "fedavg")
            )
            if key in seq[m]["best"]:
                assert seq[m]["best"][key] == pytest.approx(vec[m]["best"][key], abs=1e-6), (m, key)
        assert seq[m]["best"]["local_loss_mean"] == pytest.approx(vec[m]["best"]["local_loss_mean"], rel=1e-4)
        if m != "fedavg":
            assert seq[m]["epochs_mean"] == vec[m]["epochs_mean"]


def test_local_optimizer_trains_only_the_local_baseline():
    """The paper's protocol: Local at FedAvg's rate (5e-5), fine-tuning and the mixture at 1e-5. Setting
    ``local_optimizer`` changes the Local view and nothing else; setting it equal to ``optimizer`` changes nothing."""
    fed = make_federation(_Data(), _config().partition, 0)
    base = _run(_stopping_config(), fed)
    same = _run(_stopping_config(local_optimizer={"kind": "adam", "lr": 0.1}), fed)
    other = _run(_stopping_config(local_optimizer={"kind": "sgd", "lr": 1e-4}), fed)
    for m in ("local", "fedavg", "finetuned", "mixture"):
        assert same[m]["local_accuracy"] == base[m]["local_accuracy"], m
    for m in ("fedavg", "finetuned", "mixture"):
        assert other[m]["local_accuracy"] == base[m]["local_accuracy"], m
    assert other["local"]["best"]["local_loss_mean"] != pytest.approx(base["local"]["best"]["local_loss_mean"],
                                                                      rel=1e-3)


def test_personalising_only_the_evaluated_clients_gives_them_the_same_models():
    fed = make_federation(_Data(), _config().partition, 0)
    every = _run(_stopping_config(eval_clients=4), fed)
    sample = _run(_stopping_config(eval_clients=4, personalise="evaluated"), fed)
    for m in ("local", "finetuned", "mixture"):
        a, b = every[m]["evaluation"].per_client, sample[m]["evaluation"].per_client
        for key in ("local_accuracy", "local_loss", "global_accuracy"):
            np.testing.assert_allclose(np.asarray(a[key]), np.asarray(b[key]), rtol=1e-4, atol=1e-6, err_msg=f"{m} "
                                                                                                             f"{key}")


def test_fedmoe_run_prints_four_methods_and_writes_them(tmp_path, capsys):
    assert main(["run", "configs/fedmoe_digits.yaml", "--out", str(tmp_path / "r"),
                 "--set", "train.rounds=20", "--set", "methods.0.params.max_epochs=5"]) == 0
    out = capsys.readouterr().out
    for name in ("local", "fedavg", "finetuned", "mixture"):
        assert name in out
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert list(summary["methods"]) == ["local", "fedavg", "finetuned", "mixture"]
    for m in summary["methods"].values():
        assert 0 <= m["local_accuracy"] <= 1 and 0 <= m["global_accuracy"] <= 1
    assert summary["primary"] == "mixture"
    assert (tmp_path / "r" / "checkpoints" / "fedmoe-global-best.pt").exists()
    _check_own_class_split(tmp_path / "r", summary)


def _check_own_class_split(run_dir, summary):
    """The reported global accuracy on each client's own / other classes, and the mixture's gate weight there,
    recomputed from the saved models: own = the classes above 1/C of the client's training labels."""
    import hetfed

    run = hetfed.open_run(run_dir)
    fed = hetfed.build_federation(run.config)
    x, y = fed.global_test()
    ref: dict[str, dict[str, list[float]]] = {}
    for view in ("local", "finetuned", "mixture"):
        model = run.model(view)
        for k in model.clients:
            labels = fed.client_data(k, "train")[1]
            own = np.isin(y, np.flatnonzero(np.bincount(labels,
                                                        minlength=fed.n_classes) / len(labels) > 1 / fed.n_classes))
            hit = model.predict(x, client=k) == y
            ref.setdefault(view, {}).setdefault("own", []).append(hit[own].mean())
            ref[view].setdefault("other", []).append(hit[~own].mean())
            if view == "mixture":
                states = {n: v[k : k + 1] for n, v in model.client_states["states"].items()}
                gate = under(states, "mixture.gate.")
                with torch.no_grad():
                    h = torch.sigmoid(model.algorithm.mixture.gate.forward(gate, torch.as_tensor(x)[None], None))[
                        0, :, 0
                    ]
                ref[view].setdefault("gate_own", []).append(h.numpy()[own].mean())
                ref[view].setdefault("gate_other", []).append(h.numpy()[~own].mean())
        best = summary["methods"][view]["best"]
        assert best["global_accuracy_own"] == pytest.approx(np.mean(ref[view]["own"]), abs=1e-9), view
        assert best["global_accuracy_other"] == pytest.approx(np.mean(ref[view]["other"]), abs=1e-9), view
        assert best["global_accuracy_own"] > best["global_accuracy_other"], view  # majority split: own classes easier
    mix = summary["methods"]["mixture"]["best"]
    assert mix["gate_own"] == pytest.approx(np.mean(ref["mixture"]["gate_own"]), abs=1e-6)
    assert mix["gate_other"] == pytest.approx(np.mean(ref["mixture"]["gate_other"]), abs=1e-6)
    assert "global_accuracy_own" not in summary["methods"]["fedavg"]["best"]  # one server model: no per-client split


def test_eval_clients_sample():
    config = build_config({**_config().model_dump(mode="json"),
                           "methods": [{"algorithm": "fedmoe", "params": {"max_epochs": 2, "eval_clients": 4}}]})
    fed = make_federation(_Data(), PartitionConfig(kind="majority", clients=10, p=0.9, samples_per_client=60), 0)
    res = _run(config, fed)
    assert len(res["mixture"]["evaluation"].per_client["local_accuracy"]) == 4


@pytest.mark.draws
def test_fedmoe_sweep_writes_the_paper_figures(tmp_path):
    assert main(["sweep", "configs/fedmoe_digits.yaml", "--grid", "partition.p=0.2,1.0", "--seeds", "1",
                 "--set", "train.rounds=5", "--set", "methods.0.params.max_epochs=2", "--set", "partition.clients=8",
                 "--out", str(tmp_path / "s"), "--quiet"]) == 0
    for name in ("global_vs_local", "global_relative_to_fedavg", "best.local_accuracy_mean"):
        assert (tmp_path / "s" / "figures" / f"{name}.png").stat().st_size > 1000
    with open(tmp_path / "s" / "runs.csv", newline="") as fh:  # the gate's routing, per seed, for paired tables
        kept = {(r["method"], r["metric"]) for r in csv.DictReader(fh)}
    assert {("mixture", "best.gate_own"), ("mixture", "best.gate_other")} <= kept


def test_mixture_loss_is_exact_for_very_unlikely_true_classes():
    """Both experts logistic regressions with bias [30, 0, 0], gate at 0.5, true class 1:
    the loss is −log(½·p_s(1) + ½·p_g(1)) ≈ 30.0, and the specialist's bias still gets a gradient."""
    mix = Mixture(lambda n: build_model(ModelConfig(kind="logreg"), (2,), n), 3)
    params = {s.name: torch.zeros((1, *s.shape)) for s in mix.specs()}
    for expert in ("global", "specialist"):
        params[f"{expert}.layers.0.bias"] = torch.tensor([[30.0, 0.0, 0.0]])
    params = {k: v.requires_grad_(True) for k, v in params.items()}
    x = torch.zeros(1, 1, 2)
    loss = torch.nn.functional.cross_entropy(mix.forward(params, x)[0], torch.tensor([1]))
    loss.backward()
    # the reference, in float64 from the paper's equation
    b = torch.tensor([30.0, 0.0, 0.0], dtype=torch.float64, requires_grad=True)
    p = torch.softmax(b, -1)
    ref = -torch.log(0.5 * p[1] + 0.5 * torch.softmax(torch.tensor([30.0, 0.0, 0.0], dtype=torch.float64), -1)[1])
    ref.backward()
    assert loss.item() == pytest.approx(ref.item(), rel=1e-6)
    assert loss.item() == pytest.approx(30.0, abs=1e-3)
    torch.testing.assert_close(params["specialist.layers.0.bias"].grad[0].double(), b.grad, rtol=1e-5, atol=1e-6)
    assert params["specialist.layers.0.bias"].grad[0, 0] == pytest.approx(0.5, abs=1e-4)


def test_own_classes_are_those_above_a_uniform_share():
    """A client with labels 0,0,0,1 of 4 classes: class 0 (75%) is its own; class 1 (25% = 1/C) is not."""
    from hetfed.engine.evaluate import ClientEvalData, own_class_masks

    y = torch.tensor([0, 0, 0, 1, 2, 3, 3, 3])
    y_global = torch.tensor([0, 1, 2, 3, 0])
    data = ClientEvalData([0, 1], torch.zeros(8, 2), y, [np.array([4])] * 2, [np.array([5])] * 2,
                          torch.zeros(5, 2), y_global, 4, train=[np.array([0, 1, 2, 3]), np.array([4, 5, 6, 7])])
    own = own_class_masks(data)
    assert own[0].tolist() == [True, False, False, False, True]
    assert own[1].tolist() == [False, False, False, True, False]  # class 3: 75%; class 2: 25%
    assert own_class_masks(ClientEvalData([0], torch.zeros(8, 2), y, [np.array([4])], [np.array([5])],
                                          torch.zeros(5, 2), y_global, 4)) is None
