"""#17: memory that does not grow with the clients, evaluation that scales, refusals with an estimate."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from hetfed.algorithms import build_algorithm, resolve_run, weighted_average
from hetfed.config import ModelConfig, OptimizerConfig, PartitionConfig, TrainConfig, build_config
from hetfed.engine.client_store import ClientStore
from hetfed.engine.types import RoundUploads, StreamedUpload, Upload, concat_uploads
from hetfed.errors import RunError
from hetfed.executors.inprocess import SequentialExecutor, VectorisedExecutor, check_memory
from hetfed.executors.simulate import simulate
from hetfed.models import build_model
from hetfed.partition import make_federation
from tests.synthetic import ShiftedGaussians


def _dataset(n: int = 600, d: int = 10) -> ShiftedGaussians:
    return ShiftedGaussians(n, d, classes=4, test_per_class=30)


def _fed(clients=12):
    return make_federation(_dataset(), PartitionConfig(kind="dirichlet", clients=clients, alpha=0.5, min_size=8), 0)


def _run(fed, train, executor, kind="mlp", algorithm="fedavg"):
    model = build_model(ModelConfig(kind=kind, hidden=[16, 16]), fed.input_shape, fed.n_classes)
    params = {"server_steps": 5, "n_synthetic": 20} if algorithm == "fsnet" else None
    algo = build_algorithm(algorithm, model, train, params, in_features=int(np.prod(fed.input_shape)))
    return simulate(algo, fed, train, 1, executor=executor)


# ------------------------------------------------------------------ streamed aggregation


@settings(max_examples=30, deadline=None)
@given(sizes=st.lists(st.integers(1, 6), min_size=1, max_size=6), seed=st.integers(0, 10_000),
       server_lr=st.sampled_from([1.0, 0.5]))
def test_streamed_aggregation_equals_the_stacked_one(sizes, seed, server_lr):
    """Folding chunks into running sums gives FedAvg's Σ n_k θ_k / Σ n_k of all clients stacked at once."""
    g = torch.Generator().manual_seed(seed)
    old = {"w": torch.randn(3, 4, generator=g), "b": torch.randn(4, generator=g)}
    uploads, start = [], 0
    for n in sizes:
        ids = list(range(start, start + n))
        start += n
        uploads.append(Upload(ids, {k: torch.randn(n, *v.shape, generator=g) for k, v in old.items()},
                              torch.randint(1, 50, (n,), generator=g).float(),
                              {"train_loss": torch.rand(n, generator=g)}))
    acc = RoundUploads()
    for u in uploads:
        acc.add(u)
    streamed = acc.result()
    stacked = concat_uploads(uploads)
    assert isinstance(streamed, StreamedUpload) == (len(sizes) > 1)
    assert streamed.client_ids == stacked.client_ids
    torch.testing.assert_close(streamed.num_samples, stacked.num_samples)
    torch.testing.assert_close(streamed.extra["train_loss"], stacked.extra["train_loss"])
    a, b = weighted_average(old, streamed, server_lr), weighted_average(old, stacked, server_lr)
    for k in old:
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)
    if isinstance(streamed, StreamedUpload):
        assert streamed.params == {}  # no client's parameters are kept


@pytest.mark.parametrize("algorithm,kind", [("fedavg", "mlp"), ("fedavg", "cgau"), ("fsnet", "mlp")])
def test_results_do_not_change_with_the_chunk_size(algorithm, kind):
    fed = _fed()
    train = TrainConfig(rounds=3, local_epochs=1, batch_size=8, optimizer=OptimizerConfig(lr=0.05))
    runs = [_run(fed, train, ex, kind, algorithm) for ex in (VectorisedExecutor(), VectorisedExecutor(chunk_clients=5),
                                                            VectorisedExecutor(chunk_clients=2), SequentialExecutor())]
    for other in runs[1:]:
        for k, v in runs[0].server.params.items():
            torch.testing.assert_close(other.server.params[k], v, rtol=1e-4, atol=1e-5)
        a, b = runs[0].history[-1][1].metrics, other.history[-1][1].metrics
        assert a["global_accuracy" if kind == "mlp" else "server_accuracy"] == pytest.approx(
            b["global_accuracy" if kind == "mlp" else "server_accuracy"], abs=1e-6)


# ------------------------------------------------------------------ the client store


def test_client_store_gathers_what_it_scattered_and_tracks_who_holds_what():
    store = ClientStore(5)
    store.scatter([0, 2], {"a": torch.tensor([[1.0, 2.0], [3.0, 4.0]])})
    assert torch.equal(store.gather([2, 0])["a"], torch.tensor([[3.0, 4.0], [1.0, 2.0]]))
    assert store.gather([1, 3]) == {}  # they hold nothing yet
    assert store[1] == {} and torch.equal(store[0]["a"], torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="some of the stacked clients"):
        store.gather([0, 1])
    store[0]["a"] += 10  # the Mapping view is a view: tests and the XOR demo edit states in place
    assert torch.equal(store.gather([0])["a"], torch.tensor([[11.0, 12.0]]))
    with pytest.raises(RuntimeError, match=r"clients \[0\] returned no state 'a', which they hold"):
        store.scatter([0], {})  # a step that left out a state its client holds (it would be lost silently)
    assert set(store[0]) == {"a"}
    store.scatter([0], {}, whole=True)  # a client's whole state, loaded: it holds nothing now
    assert store[0] == {} and set(store[2]) == {"a"}
    assert store.nbytes() == 5 * 2 * 4  # one [K, 2] float32 tensor, whatever the number of holders


def test_a_gpu_runs_client_states_live_on_its_device_while_they_fit_and_on_the_cpu_beyond():
    """On a GPU run a name of client state lives on the device while the names there fit the store's budget, so a
    stack is gathered and scattered there without the host; the rest stays on the CPU. ``meta`` stands for the GPU
    (its tensors have no values: what is checked is where each one lives and goes)."""
    store = ClientStore(10, "meta", budget_bytes=10 * 4 * 4 + 10 * 8 * 4)
    store.scatter(list(range(10)), {"rows": torch.ones(10, 4)})  # an initial state, made on the host
    assert store.devices() == {"rows": torch.device("meta")}
    # (a meta tensor cannot be copied to the CPU: the stack that goes there is a CPU one here, a GPU one in a run)
    store.scatter([1, 3], {"rows": torch.ones(2, 4, device="meta"), "control": torch.ones(2, 8, device="meta"),
                           "big": torch.ones(2, 100)})
    assert store.devices() == {"rows": torch.device("meta"), "control": torch.device("meta"),
                               "big": torch.device("cpu")}
    got = store.gather([3, 1], "meta")
    assert {k: v.device.type for k, v in got.items()} == {"rows": "meta", "control": "meta", "big": "meta"}
    assert got["big"].shape == (2, 100) and got["control"].shape == (2, 8)
    store.fill({"residual": torch.zeros(3)})  # error feedback's residuals, 120 bytes: over the budget left
    assert store.devices()["residual"] == torch.device("cpu") and store.held_by_all() >= {"rows", "residual"}
    again = ClientStore(10, "meta", budget_bytes=10 * 4 * 4)
    saved = store.state_dict()  # a checkpoint, read back onto the CPU (map_location), goes back where it fits
    again.load_state_dict({**saved, "data": {k: torch.zeros(v.shape, dtype=v.dtype) for k, v in saved["data"].items()}})
    assert again.devices() == {"rows": torch.device("meta"), "control": torch.device("cpu"),
                               "big": torch.device("cpu"), "residual": torch.device("cpu")}
    cpu = ClientStore(10)  # a CPU run: everything on the CPU, as before
    cpu.scatter([0], {"a": torch.ones(1, 3)})
    assert cpu.devices() == {"a": torch.device("cpu")}


# ------------------------------------------------------------------ evaluation at scale


def test_a_sample_of_clients_is_evaluated_with_a_ci_over_them():
    fed = _fed(clients=12)
    train = TrainConfig(rounds=2, eval_clients=5, optimizer=OptimizerConfig(lr=0.05))
    result = _run(fed, train, VectorisedExecutor())
    evs = [ev for _, ev in result.history]
    local = [ev.per_client["local_accuracy"] for ev in evs]
    assert all(len(v) == 5 for v in local) and evs[0].metrics["n_eval_clients"] == 5
    v = np.asarray(local[-1])
    reference = stats.t.ppf(0.975, 4) * v.std(ddof=1) / np.sqrt(5)  # Student t over the sampled clients
    assert evs[-1].metrics["local_accuracy_ci95"] == pytest.approx(reference)
    again = _run(fed, train, VectorisedExecutor())  # the same fixed sample at every evaluation and run
    assert again.history[-1][1].per_client["local_accuracy"] == local[-1]


def test_personal_models_score_the_global_test_set_on_a_capped_fixed_subset():
    fed = _fed(clients=12)
    train = TrainConfig(rounds=1, eval_global_clients=4, optimizer=OptimizerConfig(lr=0.05))
    chunks = [_run(fed, train, VectorisedExecutor(chunk_clients=c), "cgau") for c in (None, 5)]
    for result in chunks:
        ev = result.history[-1][1]
        glob = np.asarray(ev.per_client["global_accuracy"], dtype=float)
        assert np.isfinite(glob).sum() == 4  # 4 of the 12 evaluated clients scored the global test set
        assert ev.metrics["global_accuracy"] == pytest.approx(np.nanmean(glob))
    a, b = (np.asarray(r.history[-1][1].per_client["global_accuracy"]) for r in chunks)
    assert np.array_equal(np.isfinite(a), np.isfinite(b))  # the same clients however they are chunked


def test_the_global_test_subset_is_class_balanced_made_once_and_scored_by_the_server():
    from hetfed.engine.evaluate import global_test

    fed = _fed()
    train = TrainConfig(rounds=1, global_test_size=40)
    x, y = global_test(fed, train, 1)  # the run's seed (``_run``'s)
    assert len(y) == 40 and np.bincount(y.numpy()).tolist() == [10, 10, 10, 10]
    assert not torch.equal(global_test(fed, train, 2)[0], x)  # another seed's subset
    executor = VectorisedExecutor()
    result = _run(fed, train, executor)
    assert executor.x_global is x and executor.y_global is y  # made once: the loop's, the executor's, other runs'
    model = build_model(ModelConfig(hidden=[16, 16]), fed.input_shape, fed.n_classes)
    params = {k: v.unsqueeze(0) for k, v in result.server.params.items()}
    reference = (model.forward(params, x.unsqueeze(0), None)[0].argmax(-1) == y).float().mean().item()
    assert result.history[-1][1].metrics["global_accuracy"] == pytest.approx(reference)


def test_the_evaluation_time_is_reported_apart_from_training():
    result = _run(_fed(), TrainConfig(rounds=2, optimizer=OptimizerConfig(lr=0.05)), VectorisedExecutor())
    assert result.evaluations == 2 and result.eval_seconds > 0 and result.train_seconds > 0


# ------------------------------------------------------------------ refusing what cannot fit


def test_a_run_that_cannot_fit_is_refused_with_an_estimate_by_part():
    fed = _fed()
    train = TrainConfig(rounds=1, optimizer=OptimizerConfig(kind="adam", reset_each_round=False))
    model = build_model(ModelConfig(hidden=[16, 16]), fed.input_shape, fed.n_classes)
    algo = build_algorithm("local", model, train)
    parts = check_memory(resolve_run(algo, fed, train, 0), fed, available=2**40)
    one_client = 3 * 4 * sum(p.numel() for p in model.init_shared(torch.Generator()).values())  # params, m, v
    assert parts["client_states"] >= fed.n_clients * one_client
    with pytest.raises(RunError, match=r"needs about .* GB \(pool .*client states .*\) but 0.0 GB are available"):
        check_memory(resolve_run(algo, fed, train, 0), fed, available=1000)


def test_the_cli_refuses_before_making_a_run_directory(tmp_path, capsys):
    from hetfed.cli import main

    code = main(["run", "--out", str(tmp_path / "r"), "--set", "partition.clients=1400", "--set", "partition.kind=iid",
                 "--set", "model.hidden=[4096,4096]", "--set", "methods.0.algorithm=local",
                 "--set", "train.optimizer.kind=adam", "--set", "train.optimizer.reset_each_round=false"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1 and "client states" in err
    assert not (tmp_path / "r").exists()


def test_defaults_keep_the_small_runs_unchanged():
    cfg = build_config({})
    assert cfg.train.eval_clients is None and cfg.train.global_test_size is None  # every client, all the test set
    assert cfg.train.eval_global_clients == 10  # ≥ the default 10 clients: the default run scores them all


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on the GPU machine)")
def test_a_stack_gathered_from_and_scattered_to_device_states_never_waits_on_the_device():
    """#74 item 3: the clients' states that live on the GPU are gathered and stored every round by index copies that
    do not wait for the device's queue (blocking copies did: one synchronisation a state name, each way)."""
    store = ClientStore(6, "cuda", budget_bytes=1 << 20)
    store.scatter([0, 1, 2, 3, 4, 5], {"w": torch.randn(6, 4, device="cuda"), "c": torch.randn(6, 2, device="cuda")})
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        state = store.gather([4, 1, 2], "cuda")
        store.scatter([4, 1, 2], {k: v * 2 for k, v in state.items()})
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.testing.assert_close(store[4]["w"], state["w"][0] * 2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on the GPU machine)")
@pytest.mark.parametrize("algorithm,compression", [
    ("scaffold", None),  # control variates: a model's size per client
    ("ditto", None),  # personal models
    ("fedavg", {"kind": "topk", "fraction": 0.1, "error_feedback": True}),  # the transport's residuals
])
def test_on_cuda_client_states_live_on_the_device_and_give_the_cpus_numbers(algorithm, compression):
    from hetfed.config import ServerConfig

    fed = _fed(clients=6)
    results = {}
    for device in ("cpu", "cuda"):
        train = TrainConfig(rounds=3, device=device, local_steps=4, batch_size=8,
                            optimizer=OptimizerConfig(lr=0.05, momentum=0.0))
        model = build_model(ModelConfig(kind="mlp", hidden=[16]), fed.input_shape, fed.n_classes)
        algo = build_algorithm(algorithm, model, train,
                               server=ServerConfig(compression=compression) if compression else None)
        results[device] = simulate(algo, fed, train, 1, executor=VectorisedExecutor())
    states = results["cuda"].executor.states
    assert states.devices() and all(d.type == "cuda" for d in states.devices().values())
    for k, v in results["cpu"].server.params.items():
        torch.testing.assert_close(results["cuda"].server.params[k].cpu(), v, rtol=1e-4, atol=1e-5)


def test_a_sweeps_workers_divide_a_gpus_default_memory_budget_among_them(monkeypatch):
    """Left unset, ``train.memory_budget_mb`` on CUDA is a quarter of the GPU's free memory; the workers of a
    ``hetfed sweep --jobs N`` share one device, so each takes 1/N of that (on a lent H200 six processes each
    taking a quarter ran out of memory)."""
    from hetfed.executors import inprocess
    from hetfed.runs import sweep

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8 * 2**30, 16 * 2**30))
    monkeypatch.setattr(inprocess, "_GPU_SHARE", [1.0])  # this process's own share, restored after the test
    monkeypatch.setattr("hetfed.engine.host_threads.limit_threads", lambda threads: None)
    monkeypatch.setattr("hetfed.pipeline.share_in_this_process", lambda: None)
    assert inprocess.default_budget_mb("cuda") == 2048  # a quarter of 8 GiB free
    sweep._init_worker(1, 4)  # what each of a --jobs 4 sweep's workers runs first
    assert inprocess.default_budget_mb("cuda") == 512
    assert inprocess.state_budget_bytes("cuda") == 512 * 2**20  # the clients' stored states too
    assert inprocess.default_budget_mb("cpu") == inprocess.CPU_BUDGET_MB  # a CPU's is a cache's size, not shared
