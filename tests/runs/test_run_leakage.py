"""What the server learns inside a run (#76): ``leakage.kind`` attacks what the server really holds — the reported
model (membership) or one client's upload in one round (inversion) — without changing the run, and is refused where
it cannot be measured."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hetfed.analysis.report import write_report
from hetfed.config import build_config
from hetfed.errors import ConfigError
from hetfed.leakage import gradient
from hetfed.runs.leakage import InversionObserver, observed
from hetfed.runs.rundir import read_summary
from hetfed.runs.runner import run_experiment
from hetfed.runs.sweep import run_sweep


def _config(**over):
    base = {
        "dataset": {"name": "digits"}, "partition": {"kind": "dirichlet", "clients": 4, "alpha": 1.0},
        "model": {"kind": "mlp", "hidden": [16]},
        "train": {"rounds": 2, "batch_size": 16, "optimizer": {"kind": "sgd", "lr": 0.1}},
        "methods": [{"name": "fedavg", "algorithm": "fedavg"},
                    {"name": "cgau", "algorithm": "fedavg", "model": {"kind": "cgau", "hidden": [16]}}],
    }
    for key, value in over.items():
        base[key] = value
    return build_config(base)


def _run(tmp_path, name, **over):
    return run_experiment(_config(**over), out=tmp_path / name, progress=False).run_dir


def test_membership_is_reported_beside_accuracy_and_leaves_the_run_as_it_was(tmp_path):
    plain = _run(tmp_path, "plain")
    attacked = _run(tmp_path, "mi", leakage={"kind": "loss_threshold", "samples": 200})
    assert (plain / "metrics.csv").read_bytes() == (attacked / "metrics.csv").read_bytes()
    methods = read_summary(attacked)["methods"]
    fedavg, cgau = methods["fedavg"]["leakage"], methods["cgau"]["leakage"]
    assert fedavg["attack"] == "loss_threshold" and 0 <= fedavg["global_auc"] <= 1
    assert "personal_auc" not in fedavg  # every FedAvg client predicts with the server's model: nothing of its own
    assert 0 <= cgau["personal_auc"] <= 1 and 0 <= cgau["personal_tpr_at_1pct_fpr"] <= 1  # CGAU's own rows
    assert "leakage" not in read_summary(plain)["methods"]["fedavg"]
    with np.load(attacked / "leakage" / "cgau.npz") as arrays:  # the scores the ROC curves are drawn from
        assert len(arrays["personal_members"]) == len(arrays["personal_others"]) > 0
    assert "membership inference on the reported models" in write_report(attacked).read_text()
    assert "what the server learnt" not in write_report(plain).read_text()


def test_a_personalised_methods_views_are_each_attacked(tmp_path):
    out = _run(tmp_path, "moe", methods=[{"name": "fedmoe", "algorithm": "fedmoe"}],
               leakage={"kind": "loss_threshold", "samples": 100})
    rows = read_summary(out)["methods"]
    assert all("personal_auc" in row["leakage"] for row in rows.values()), rows.keys()
    assert sum("global_auc" in row["leakage"] for row in rows.values()) == 1  # the federated view's server model


def test_clients_that_fit_their_model_to_their_data_are_attacked_on_the_model_they_fit(tmp_path, monkeypatch):
    """IFCA's client predicts with the cluster it chooses on its validation rows, kNN-Per's mixes its datastore: the
    membership attack queries that model (``fitted_predictor``). IFCA's run failed at its end: its clients have no
    model without their data."""
    from hetfed.algorithms.knnper import NearestNeighbours
    from hetfed.executors.inprocess import InProcessExecutor

    queried = []
    predictors = InProcessExecutor.predictors

    def seen(self, bc, clients, view=None):
        for chunk, pred in predictors(self, bc, clients, view):
            queried.append((self.algo.spec.name, type(pred.model)))
            yield chunk, pred

    monkeypatch.setattr(InProcessExecutor, "predictors", seen)
    out = _run(tmp_path, "fit", methods=[{"name": m, "algorithm": m} for m in ("ifca", "knnper")],
               leakage={"kind": "loss_threshold", "samples": 100})
    rows = read_summary(out)["methods"]
    assert all(0 <= rows[m]["leakage"]["personal_auc"] <= 1 for m in ("ifca", "knnper"))
    assert ("knnper", NearestNeighbours) in queried and {name for name, _ in queried} == {"ifca", "knnper"}


def test_the_inverted_upload_is_the_one_the_client_sent(tmp_path):
    """FedSGD (one step over the client's whole data, plain SGD): the update the attack reads is exactly −lr·∇ of
    the client's loss at the model the server sent."""
    cfg = _config(train={"rounds": 1, "batch_size": 10_000, "local_steps": 1, "optimizer": {"kind": "sgd", "lr": 0.1}},
                  methods=[{"name": "fedavg", "algorithm": "fedavg"}], leakage={"kind": "label_counts", "client": 2})
    seen = {}

    def spy(self, rnd, bc, clients, executor):
        seen.update(obs=observed(self.spec, self.fed, bc, executor.watch(bc, 2)), pool=executor.pool, fed=self.fed)
        original(self, rnd, bc, clients, executor)

    original = InversionObserver.sending
    try:
        InversionObserver.sending = spy
        out = run_experiment(cfg, out=tmp_path / "fedsgd", progress=False).run_dir
    finally:
        InversionObserver.sending = original
    obs, pool, fed = seen["obs"], seen["pool"], seen["fed"]
    at = torch.as_tensor(fed.train[2])
    x, y = pool.x[at], pool.y[at]
    truth = gradient(obs.model, obs.params, x, F.one_hot(y, 10).float())
    for name, g in obs.gradient.items():
        torch.testing.assert_close(g, truth[name], rtol=1e-4, atol=1e-5)
    assert obs.batch == len(at)
    found = read_summary(out)["methods"]["fedavg"]["leakage"]
    assert found["attack"] == "label_counts" and found["sent"] == 1
    assert found["labels_recovered"] > 0.9  # a fresh model's one-step update gives the batch's labels away


def test_an_inversion_is_scored_by_psnr_and_ssim_and_a_client_left_out_sent_nothing(tmp_path):
    found = read_summary(_run(tmp_path, "dlg", methods=[{"name": "fedavg", "algorithm": "fedavg"}],
                              leakage={"kind": "dlg", "iterations": 2}))["methods"]["fedavg"]["leakage"]
    assert found["sent"] == 1 and found["psnr"] > 0 and -1 <= found["ssim"] <= 1 and found["reconstructed"] > 1
    run_dir = tmp_path / "dlg"
    with np.load(run_dir / "leakage" / "fedavg.npz") as arrays:  # what report.html draws
        assert arrays["guess"].shape == arrays["truth"].shape == (found["reconstructed"], 8, 8)
    page = write_report(run_dir).read_text()
    assert "what the server learnt" in page and "gradient inversion of one client" in page
    absent = read_summary(_run(tmp_path, "absent", methods=[{"name": "fedavg", "algorithm": "fedavg"}],
                               train={"rounds": 1, "client_fraction": 0.25, "batch_size": 16,
                                      "optimizer": {"kind": "sgd", "lr": 0.1}},
                               leakage={"kind": "dlg", "client": 3, "iterations": 1}))["methods"]["fedavg"]["leakage"]
    assert absent["sent"] in (0, 1) and ("psnr" in absent) == (absent["sent"] == 1)


@pytest.mark.parametrize(("over", "message"), [
    ({"leakage": {"kind": "idlg"}}, "leakage.kind = 'idlg' reads an update of at most 1 sample"),
    ({"leakage": {"kind": "dlg", "client": 9}}, "leakage.client = 9 is not allowed: the federation has 4 clients"),
    ({"leakage": {"kind": "dlg", "round": 3}}, "leakage.round = 3 is not allowed: methods.0 trains 2 rounds"),
    ({"leakage": {"kind": "dlg"}, "methods": [{"name": "a", "algorithm": "fedasync", "params": {"concurrency": 2}}]},
     "leakage.kind = 'dlg' is not allowed with methods.0.algorithm = 'fedasync'"),
    ({"leakage": {"kind": "loss_threshold", "iterations": 3}}, "unknown key 'leakage.iterations'"),
])
def test_an_attack_that_cannot_be_measured_is_refused_before_any_file(tmp_path, over, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        _run(tmp_path, "bad", **over)
    assert not (tmp_path / "bad").exists()


def test_an_executor_that_cannot_hand_over_a_clients_update_is_refused_before_any_file(tmp_path):
    """A plugin executor without ``watch``/``watched`` fails an inversion at planning, in one line naming the executors
    that can run it — not mid-run with an AttributeError; a membership attack, which reads no update, runs on it."""
    over = {"plugins": ["tests.plugin_executor"], "methods": [{"name": "fedavg", "algorithm": "fedavg"}],
            "train": {"rounds": 1, "batch_size": 16, "executor": "plugin_unwatched"}}
    with pytest.raises(ConfigError, match=r"leakage.kind = 'dlg' is not allowed with train.executor = "
                       r"'plugin_unwatched': .* expected train.executor in \[.*'vectorised'"):
        _run(tmp_path, "bad", leakage={"kind": "dlg"}, **over)
    assert not (tmp_path / "bad").exists()
    assert "global_auc" in read_summary(_run(tmp_path, "ok", leakage={"kind": "loss_threshold"}, **over))[
        "methods"]["fedavg"]["leakage"]


def test_a_sweeps_runs_csv_carries_the_leakage_beside_the_accuracy(tmp_path):
    cfg = _config(methods=[{"name": "fedavg", "algorithm": "fedavg"}], leakage={"kind": "loss_threshold"})
    run_sweep(cfg, {}, seeds=2, out=tmp_path / "sweep", progress=False)
    with open(tmp_path / "sweep" / "runs.csv") as fh:
        metrics = {r["metric"] for r in csv.DictReader(fh)}
    assert {"leakage.global_auc", "leakage.global_tpr_at_1pct_fpr", "final.global_accuracy"} <= metrics
    page = write_report(tmp_path / "sweep").read_text()  # the leakage column beside the accuracy
    assert (
        "membership AUC against the server&#x27;s model" in page or "membership AUC against the server's model" in page
    )


def test_labels_recovered_counts_against_what_the_update_went_over(tmp_path):
    """One step of B = 4 out of a client's dozens of samples: 4 labels to recover, not all of the client's."""
    found = read_summary(_run(tmp_path, "few", methods=[{"name": "fedavg", "algorithm": "fedavg"}],
                              train={"rounds": 1, "batch_size": 4, "local_steps": 1,
                                     "optimizer": {"kind": "sgd", "lr": 0.1}},
                              leakage={"kind": "label_counts", "client": 1}))["methods"]["fedavg"]["leakage"]
    assert found["reconstructed"] == 0 and found["labels_recovered"] == 1.0  # a fresh model's step: every label


def test_a_stacked_sweep_measures_what_the_one_by_one_sweep_does(tmp_path):
    """The attack reads each run's own executor (its pool, its clients' states) also when its runs are stacked."""
    cfg = _config(methods=[{"name": "cgau", "algorithm": "fedavg", "model": {"kind": "cgau", "hidden": [16]}}],
                  leakage={"kind": "loss_threshold", "samples": 200})
    for name, stack in (("one", False), ("stacked", True)):
        run_sweep(cfg, {}, seeds=2, out=tmp_path / name, progress=False, stack=stack)

    def values(name):
        with open(tmp_path / name / "runs.csv") as fh:
            return {(r["seed"], r["method"], r["metric"]): float(r["value"]) for r in csv.DictReader(fh)
                    if r["metric"].startswith("leakage.")}

    one, stacked = values("one"), values("stacked")
    assert one and one.keys() == stacked.keys()
    assert all(one[k] == pytest.approx(stacked[k], abs=1e-9) for k in one)


def test_reconstructions_are_matched_to_their_nearest_samples_without_a_tensor_of_all_differences():
    """Under SecAgg+ an inversion is scored against every sample of the round's clients (42 000 Fashion-MNIST images
    against 200 guesses): the nearest sample of each guess from a distance matrix, not from all their differences
    (which asked for 24.5 GiB there)."""
    import tracemalloc

    from hetfed.runs.leakage import _image_scores

    rng = np.random.default_rng(0)
    truth = rng.random((5000, 28, 28)).astype(np.float32)
    chosen = rng.choice(len(truth), 100, replace=False)
    guess = truth[chosen] + 0.01 * rng.standard_normal((100, 28, 28)).astype(np.float32)
    tracemalloc.start()
    try:
        found = _image_scores(truth, guess)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 200 * 2**20, peak  # all differences: 100 × 5 000 × 784 floats, 1.6 GB
    np.testing.assert_array_equal(found.arrays["truth"], truth[chosen])
    assert found.numbers["psnr"] > 35
