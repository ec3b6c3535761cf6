"""Batch-norm state, explicitly (#48 §3): what each algorithm does with a model's buffers is declared
(``Capabilities.buffers``) and checked against what it really uploads and keeps, with PFLlib's 4-layer CNN and
batch normalisation — the zoos' most reported baseline bug is FedAvg averaging these statistics or not."""

from __future__ import annotations

import pytest
import torch

from hetfed.algorithms import algorithm_for, registry
from hetfed.config import build_config
from hetfed.engine.rng import CLIENT_INIT, SERVER_INIT, torch_gen
from hetfed.engine.types import stack_states
from hetfed.executors.inprocess import Pool, client_data
from hetfed.pipeline import prepare

#: hetfed's own algorithms that run on PFLlib's CNN (the LoRA methods run on a pretrained encoder only)
CNN4_METHODS = [n for n in registry.names() if registry.get(n).cls.__module__.startswith("hetfed.")
                and registry.get(n).capabilities.model_kinds in (None, ("cnn4",))]


def _round(name: str, clients=(0, 1)):
    spec = registry.get(name)
    method = {"name": "m", "algorithm": name, "model": {"kind": "cnn4", "batch_norm": True}, "params": dict(spec.quick)}
    cfg = build_config({"partition": {"clients": 3}, "train": {"rounds": 1, "local_steps": 2}, "methods": [method]})
    fed = prepare(cfg, progress=False).federation
    algo = algorithm_for(cfg, cfg.methods[0], fed.input_shape, fed.n_classes)
    algo.bind(fed, 0, len(clients))  # as the driver does, then the executor hands the stack its clients' broadcast
    server = algo.server_init(torch_gen(0, SERVER_INIT))
    states = stack_states([algo.client_init(k, torch_gen(0, CLIENT_INIT, k)) for k in clients])
    pool = Pool(torch.as_tensor(fed.x), torch.as_tensor(fed.y), fed.train, 0, fed.val)
    upload, new = algo.local_update(algo.broadcast(server, 0).for_clients(clients), states,
                                    client_data(pool, list(clients), 0))
    return algo, server, states, upload, new


def _carried(names, buffer: str) -> bool:
    """``buffer`` among ``names``, as itself or as a method's copy of the model (``cluster.1.bn1.running_mean``)."""
    return any(n == buffer or n.endswith("." + buffer) for n in names)


@pytest.mark.parametrize("name", CNN4_METHODS)
def test_every_algorithm_does_with_batch_norm_statistics_what_it_declares(name):
    algo, _, _, upload, new = _round(name)
    buffers = algo.model.buffer_names
    assert buffers
    declared = algo.capabilities.buffers
    uploaded = [b for b in buffers if _carried(upload.params, b)]
    kept = [b for b in buffers if _carried(new, b)]
    if declared == "aggregated":
        assert uploaded == buffers, f"{name} declares aggregated statistics but uploads only {uploaded}"
    elif declared == "local":
        assert not uploaded and kept == buffers, f"{name} declares local statistics: uploads {uploaded}, keeps {kept}"


def test_fedavg_averages_the_running_statistics_weighted_by_samples():
    algo, server, _, upload, _ = _round("fedavg")
    new = algo.aggregate(server, upload)
    w = upload.num_samples / upload.num_samples.sum()
    for b in algo.model.buffer_names:
        want = (upload.params[b] * w.view(-1, *([1] * (upload.params[b].dim() - 1)))).sum(0)
        torch.testing.assert_close(new.params[b], want)
        assert not torch.equal(new.params[b], server.params[b])  # the clients' statistics moved


def test_fedbn_keeps_each_clients_statistics_and_starts_its_next_round_from_them():
    algo, server, states, upload, new = _round("fedbn")
    for b in algo.model.buffer_names:
        assert b not in upload.params and b not in server.params
        assert not torch.equal(new[b][0], states[b][0])  # updated by the client's own batches
        assert not torch.equal(new[b][0], new[b][1])  # two clients, two sets of statistics


def test_ditto_aggregates_the_global_models_statistics_and_keeps_the_personal_models_own():
    algo, server, states, upload, new = _round("ditto")
    for b in algo.model.buffer_names:
        assert b in upload.params
        personal = "ditto." + b
        assert not torch.equal(new[personal][0], states[personal][0])  # the personal pass updates its own
        assert not torch.equal(new[personal][0], upload.params[b][0])  # and they are not the global model's


def _statistics(algo, entries) -> dict:
    """The entries of ``entries`` that are running statistics: the model's, or a method's copy's (prefixed)."""
    return {k: v for k, v in entries.items() if any(k == b or k.endswith("." + b) for b in algo.model.buffer_names)}


@pytest.mark.parametrize("name", CNN4_METHODS)
def test_every_copy_of_the_model_a_method_sends_or_keeps_moves_its_own_statistics_in_a_round(name):
    """APFL's local model, pFedMe's θ and every FedEM component kept their initial statistics: their forward wrote
    the model's names (``Noise.updates``), so the copy's own were never moved (and APFL's mixture overwrote its global
    copy's). Now each copy's forward writes under its prefix (``Noise.under``): every running statistic a method
    uploads or keeps after a round of two steps on data differs from where it started."""
    algo, _, _, upload, new = _round(name)
    start = algo.model.init_shared(torch_gen(0, SERVER_INIT))  # round 0: every copy starts from the model's own
    moved = {**_statistics(algo, upload.params), **_statistics(algo, new)}
    assert moved
    for k, v in moved.items():
        was = start[next(b for b in algo.model.buffer_names if k == b or k.endswith("." + b))]
        assert not torch.equal(v, was.expand_as(v)), f"{name}: {k} kept its value from the round's start"


def test_apfls_global_copy_trains_as_fedavgs_its_statistics_too():
    """APFL's w follows ∇f_i(w) alone (Algorithm 1; the mixture's gradient reaches v and α only): its upload is
    FedAvg's, batch-norm statistics included — the mixture's passes move the local model's statistics, not w's."""
    algo, server, _, apfl, new = _round("apfl")
    _, _, _, fedavg, _ = _round("fedavg")
    assert set(apfl.params) == set(fedavg.params)
    for k in fedavg.params:
        torch.testing.assert_close(apfl.params[k], fedavg.params[k], rtol=0, atol=0, msg=k)
    # the personalised model α v + (1 − α) w predicts with the statistics its passes moved: the local model's own
    predictor = algo.predictor(algo.broadcast(algo.aggregate(server, apfl), 1).for_clients([0, 1]), new, 2)
    for b in algo.model.buffer_names:
        torch.testing.assert_close(predictor.params[b], new["apfl.v." + b], rtol=0, atol=0)
        assert not torch.equal(new["apfl.v." + b], apfl.params[b])


def test_pfedmes_local_model_carries_its_personal_models_statistics():
    """pFedMe's w never runs forward (it moves towards θ): it sends the statistics θ's passes moved, as the authors'
    one network does, and θ keeps them for its predictions."""
    algo, _, _, upload, new = _round("pfedme")
    for b in algo.model.buffer_names:
        torch.testing.assert_close(upload.params[b], new["pfedme.theta." + b], rtol=0, atol=0)


def test_each_fedem_component_has_statistics_of_its_own():
    algo, _, _, upload, _ = _round("fedem")
    for b in algo.model.buffer_names:
        assert not torch.equal(upload.params["fedem.0." + b], upload.params["fedem.1." + b])


def test_an_unknown_buffer_handling_is_refused():
    from hetfed.interface import Capabilities

    with pytest.raises(ValueError, match=r"buffers = 'averaged'; expected one of aggregated, local, reset"):
        Capabilities(buffers="averaged")


@pytest.mark.parametrize("name", CNN4_METHODS)
def test_every_algorithm_declares_whether_its_server_keeps_a_row_per_client(name):
    """``Capabilities.per_client`` against the broadcast after a round: rows per client (Broadcast.personal) exactly
    when declared — what the memory notes in docs/scale.md and the saved-run predictions rely on."""
    algo, server, _, upload, _ = _round(name)
    after = algo.aggregate(server, upload)
    assert bool(algo.broadcast(after, 1).personal) == algo.capabilities.per_client
