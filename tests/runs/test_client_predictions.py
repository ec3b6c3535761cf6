"""A saved run's client models predict as the run scored them: ``open_run(dir).model(m).predict(x, client=k)`` on
client k's test set gives the accuracy metrics.csv has for it at the last round — for methods whose server keeps a
row per client (FedFomo, pFedHN, pFedLA, FedCAC, FedPAC, Floco), whose clients read the server's statistics
(FedProto's prototypes, pFedFDA's Gaussians), that fit their model to their own data as they evaluate (kNN-Per,
Per-FedAvg, IFCA, CFL), and whose clients hold the global model (FedAvg, SCAFFOLD)."""

from __future__ import annotations

import pytest
import torch

import hetfed
from hetfed.errors import ConfigError

#: (method, its parameters): every way a client's model is made
METHODS = {
    "fedavg": {}, "scaffold": {}, "ditto": {}, "fedbabu": {},
    "fedfomo": {}, "pfedhn": {}, "pfedla": {}, "fedcac": {}, "fedpac": {}, "floco": {"tau": 2},
    "fedproto": {}, "pfedfda": {},
    "knnper": {}, "perfedavg": {}, "ifca": {}, "cfl": {},
}
CLIENTS, ROUNDS = 4, 3


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    out = tmp_path_factory.mktemp("clients") / "run"
    config = hetfed.load_config("configs/default.yaml", {
        "train.rounds": ROUNDS, "train.eval_every": 1, "partition.clients": CLIENTS, "heterogeneity.gamma": False,
        "methods": [{"name": m, "algorithm": m, "params": p} for m, p in METHODS.items()]})
    run = hetfed.run(config, out=out, progress=False, report=False)
    return run, hetfed.build_federation(run.config)


def _last_round_accuracy(run, method: str) -> dict[str, float]:
    m = run.metrics()
    rows = m[(m.method == method) & (m.split == "client") & (m.metric == "local_accuracy")]
    last = rows[rows["round"] == rows["round"].max()]
    return dict(zip(last["client"].astype(str), last["value"].astype(float), strict=True))


@pytest.mark.parametrize("method", [*METHODS, "fedbabu_ft"])
def test_each_clients_saved_model_scores_its_test_set_as_the_run_did(saved, method):
    run, fed = saved
    want = _last_round_accuracy(run, method)
    model = run.model(method, which="final")
    for k in range(CLIENTS):
        x, y = fed.client_data(k, "test")
        assert (model.predict(x, client=k) == y).mean() == pytest.approx(want[str(k)], abs=1e-12), (method, k)


def test_a_saved_run_keeps_only_what_the_clients_predict_with(saved):
    """FedFomo's broadcast carries M candidate models for each client to train with; the saved rows are its own."""
    run, _ = saved
    ckpt = run.dir / "checkpoints"
    kept = torch.load(ckpt / "fedfomo-final-served.pt", weights_only=True)
    assert kept["personal"] and all(k.startswith("fomo.own.") for k in kept["personal"])
    assert set(torch.load(ckpt / "fedproto-final-served.pt", weights_only=True)["extra"]) == {"prototypes", "known"}
    assert not (ckpt / "fedavg-final-served.pt").exists()  # its clients predict with the model it saves
    assert not (ckpt / "knnper-final-served.pt").exists()  # the global model and the client's own rows


def test_clients_without_a_model_of_their_own_are_refused_by_name(saved):
    run, fed = saved
    x, _ = fed.client_data(0, "test")
    for method in ("fedavg", "fedfomo", "knnper"):
        with pytest.raises(ConfigError, match=rf"client {CLIENTS} is not allowed: {method} has a model of its own "
                                              rf"for clients \[0, 1, 2, 3\]"):
            run.model(method).predict(x, client=CLIENTS)


def test_a_run_saved_without_the_servers_rows_says_so(saved, tmp_path):
    """A run written before hetfed saved the server's rows (the file gone): refused in one line naming it."""
    import shutil

    run, fed = saved
    copy = tmp_path / "old"
    shutil.copytree(run.dir, copy)
    (copy / "checkpoints" / "pfedhn-final-served.pt").unlink()
    x, _ = fed.client_data(0, "test")
    with pytest.raises(ConfigError, match=r"client predictions of this saved pfedhn run are not possible: .*"
                                          r"\(checkpoints/<model>-served.pt\) lack"):
        hetfed.open_run(copy).model("pfedhn", which="final").predict(x, client=0)


def test_a_client_model_fitted_to_its_data_needs_that_data(saved):
    """A Model without its run's federation (built by hand) says what kNN-Per's client prediction needs."""
    from dataclasses import replace

    run, fed = saved
    x, _ = fed.client_data(0, "test")
    with pytest.raises(ConfigError, match="need the client's own data, which this model was loaded without"):
        replace(run.model("knnper"), federation=None).predict(x, client=0)


def test_a_personal_views_model_has_no_global_prediction(saved):
    """FedBABU's fine-tuned view is each client's own: ``predict(x)`` without a client is refused (it gave the
    federated view's global model, silently), the federated view answers it."""
    run, fed = saved
    x, y = fed.global_test()
    with pytest.raises(ConfigError, match="client=None is not allowed for fedbabu_ft: it is each client's own model "
                                          r"\(the global one is 'fedbabu'\)"):
        run.model("fedbabu_ft").predict(x)
    final = run.summary["methods"]["fedbabu"]["final"]
    assert (run.model("fedbabu", which="final").predict(x) == y).mean() == pytest.approx(final["global_accuracy"])
