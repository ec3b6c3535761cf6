"""Asynchronous FL on the simulated clock (#49): FedBuff and FedAsync against their papers' update rules (not the
code), FedBuff = FedAvg where the paper says so, the event order deterministic and independent of stacking, and a
run killed mid-queue resumed event for event."""

from __future__ import annotations

import dataclasses
import io
import math

import numpy as np
import pytest
import torch

from hetfed.algorithms import build_algorithm
from hetfed.algorithms._async import staleness_weight
from hetfed.cli import main
from hetfed.config import ModelConfig, PartitionConfig, ServerConfig, TrainConfig
from hetfed.engine.types import ServerState, Upload
from hetfed.executors.inprocess import SequentialExecutor, VectorisedExecutor
from hetfed.executors.simulate import RoundObserver, simulate
from hetfed.models import build_model
from hetfed.partition import make_federation
from hetfed.runs.checkpoint import snapshot
from tests.synthetic import ShiftedGaussians


def _fed(clients=8, kind="iid"):
    data = ShiftedGaussians(n=400, d=5, classes=3)
    part = PartitionConfig(kind=kind, clients=clients, **({"alpha": 0.3, "min_size": 8} if kind == "dirichlet" else {}))
    return make_federation(data, part, 0)


def _train(rounds=4, **kw):
    return TrainConfig(**{"rounds": rounds, "local_steps": 3, "batch_size": 8, "eval_every": 1,
                          "checkpoint_every": None, "optimizer": {"kind": "sgd", "lr": 0.1, "momentum": 0.0}, **kw})


def _model(fed):
    return build_model(ModelConfig(kind="mlp", hidden=[8]), fed.input_shape, fed.n_classes)


# ------------------------------------------------------------------ the papers' rules, transcribed


@pytest.mark.parametrize("kind,expected", [
    ("constant", lambda t: 1.0),
    ("polynomial", lambda t: (t + 1) ** -0.5),  # FedAsync §5.2, a = 0.5; FedBuff's 1/sqrt(1 + staleness)
    ("hinge", lambda t: 1.0 if t <= 4 else 1.0 / (10 * (t - 4) + 1)),  # a = 10, b = 4
])
def test_staleness_functions_are_fedasyncs(kind, expected):
    from hetfed.algorithms._async import AsyncParams

    p = AsyncParams(staleness=kind)
    taus = np.arange(0, 12)
    assert np.allclose(staleness_weight(taus, p), [expected(t) for t in taus])


def _rows(n, gen):
    return {"w": torch.randn(n, 3, 2, generator=gen), "b": torch.randn(n, 2, generator=gen)}


def test_fedbuffs_server_step_is_algorithm_1():
    """x ← x − η_g·Δ̄/K with Δ̄ = Σᵢ s(τᵢ)·Δᵢ and Δᵢ = y₀ − y_Q, the change a client made to the model it was sent."""
    fed = _fed()
    eta = 0.7
    algo = build_algorithm("fedbuff", _model(fed), _train(), {"concurrency": 4, "buffer": 3},
                           server=ServerConfig(optimizer={"lr": eta}))
    gen = torch.Generator().manual_seed(0)
    x = {k: v[0] for k, v in _rows(1, gen).items()}
    starts, trained = _rows(3, gen), _rows(3, gen)
    tau = np.array([0.0, 2.0, 5.0])
    new = algo.merge(ServerState(x, 7), Upload([3, 1, 2], trained, torch.tensor([10.0, 20.0, 30.0])), starts, tau)
    for k in x:
        delta_bar = sum((1 / math.sqrt(1 + tau[i])) * (starts[k][i] - trained[k][i]) for i in range(3))
        torch.testing.assert_close(new.params[k], x[k] - eta * delta_bar / 3)
    assert new.round == 8


@pytest.mark.parametrize("staleness", ["constant", "polynomial", "hinge"])
def test_fedasyncs_mixing_is_the_papers(staleness):
    """x_t = (1 − α_t)·x_{t−1} + α_t·x_new, α_t = α·s(t − τ)."""
    fed = _fed()
    algo = build_algorithm("fedasync", _model(fed), _train(), {"staleness": staleness, "alpha": 0.8})
    gen = torch.Generator().manual_seed(1)
    x = {k: v[0] for k, v in _rows(1, gen).items()}
    trained = _rows(1, gen)
    for tau in (0.0, 3.0, 9.0):
        s = {"constant": 1.0, "polynomial": (tau + 1) ** -0.5,
             "hinge": 1.0 if tau <= 4 else 1 / (10 * (tau - 4) + 1)}[staleness]
        new = algo.merge(ServerState(x, 0), Upload([0], trained, torch.ones(1)), trained, np.array([tau]))
        for k in x:
            torch.testing.assert_close(new.params[k], (1 - 0.8 * s) * x[k] + 0.8 * s * trained[k][0])


# ------------------------------------------------------------------ runs


def test_fedbuff_with_every_client_at_once_and_no_spread_is_fedavg():
    """K = M = every client, equal latencies, η_g = 1: every arrival has staleness 0 and the buffer is a round."""
    fed = _fed()
    train = _train(rounds=4)
    a = simulate(build_algorithm("fedavg", _model(fed), train), fed, train, seed=0)
    b = simulate(build_algorithm("fedbuff", _model(fed), train, {"concurrency": 8, "buffer": 8,
                                                                 "weighting": "samples"}), fed, train, seed=0)
    for k in a.server.params:
        torch.testing.assert_close(b.server.params[k], a.server.params[k], rtol=1e-5, atol=1e-6)
    assert b.sim_time == pytest.approx(a.sim_time)  # the same four rounds of the slowest client


class Trace(RoundObserver):
    def __init__(self):
        self.rows, self.rejected, self.nonfinite = [], [], []

    def trained(self, rnd, metrics):
        self.rows.append((rnd, metrics["sim_time"], metrics["staleness_mean"], metrics["staleness_max"],
                          metrics["clients_aggregated"]))
        self.rejected.append(metrics.get("clients_rejected_norm", 0))
        self.nonfinite.append(metrics.get("clients_rejected_nonfinite", 0))


@pytest.mark.parametrize("name,params", [("fedbuff", {"concurrency": 5, "buffer": 3}),
                                         ("fedasync", {"concurrency": 4, "staleness": "hinge"})])
def test_the_event_order_is_fixed_by_the_seed_and_not_by_the_stacking(name, params):
    fed = _fed(clients=10, kind="dirichlet")
    train = _train(rounds=12, clock={"latency": "lognormal", "spread": 1.0})
    runs = []
    for executor in (VectorisedExecutor(), SequentialExecutor(), VectorisedExecutor(chunk_clients=2)):
        trace = Trace()
        r = simulate(build_algorithm(name, _model(fed), train, params), fed, train, seed=5, executor=executor,
                     observers=[trace])
        runs.append((r, trace.rows))
    (a, ta), *others = runs
    assert len(ta) == 12 and max(row[3] for row in ta) > 0  # stale arrivals happened
    for b, tb in others:
        assert tb == ta  # the same events at the same simulated times
        for k in a.server.params:
            torch.testing.assert_close(b.server.params[k], a.server.params[k], rtol=1e-4, atol=1e-5)
    other_seed = Trace()
    simulate(build_algorithm(name, _model(fed), train, params), fed, train, seed=6, observers=[other_seed])
    assert other_seed.rows != ta


def test_a_stack_of_several_versions_is_screened_as_each_version_alone():
    """Clients sent different versions train as one stack and are screened per version from norms computed once
    for the stack: with a norm filter tight enough to reject, the same updates are rejected (and counted) as when
    each version's clients train and are screened on their own."""
    fed = _fed(clients=10, kind="dirichlet")
    train = _train(rounds=10, clock={"latency": "lognormal", "spread": 1.0})
    server = ServerConfig(screen={"norm_factor": 1.02, "reference_clients": 4})
    params = {"concurrency": 7, "buffer": 3}
    runs = []
    for stacks_runs in (True, False):
        algo = build_algorithm("fedbuff", _model(fed), train, params, server=server)
        algo.spec = dataclasses.replace(algo.spec, capabilities=dataclasses.replace(algo.capabilities,
                                                                                      stacks_runs=stacks_runs))
        trace, seen = Trace(), []
        original = VectorisedExecutor.train_rows

        def counting(self, bc, clients, rounds, seen=seen, original=original):
            seen.append(len(set(rounds)))
            return original(self, bc, clients, rounds)

        VectorisedExecutor.train_rows = counting
        try:
            r = simulate(algo, fed, train, seed=3, observers=[trace])
        finally:
            VectorisedExecutor.train_rows = original
        runs.append((r, trace, seen))
    (a, ta, mixed), (b, tb, none) = runs
    assert max(mixed) > 1 and not none  # one run stacked several versions, the other never did
    assert sum(ta.rejected) > 0  # the filter rejected updates
    assert ta.rows == tb.rows and ta.rejected == tb.rejected
    for k in a.server.params:
        torch.testing.assert_close(b.server.params[k], a.server.params[k], rtol=1e-5, atol=1e-6)


def test_a_buffer_the_norm_filter_leaves_too_few_of_is_skipped_like_a_round():
    """``server.min_clients`` counts a merge's accepted arrivals: a buffer with fewer left after the norm filter
    moves no model, and metrics.csv says so (``round_skipped``, ``clients_aggregated`` 0, the rejections counted)."""
    fed = _fed(clients=10, kind="dirichlet")
    train = _train(rounds=10, clock={"latency": "lognormal", "spread": 1.0})
    server = ServerConfig(screen={"norm_factor": 1.02, "reference_clients": 4}, min_clients=3)
    trace = Trace()
    r = simulate(build_algorithm("fedbuff", _model(fed), train, {"concurrency": 7, "buffer": 3}, server=server),
                 fed, train, seed=3, observers=[trace])
    skipped = [row for row, rejected in zip(trace.rows, trace.rejected, strict=True) if row[4] == 0]
    assert skipped and all(rejected > 0 for row, rejected in zip(trace.rows, trace.rejected, strict=True)
                           if row[4] == 0)
    assert r.server.round == 10 - len(skipped) and r.skipped_rounds == [row[0] for row in skipped]


class KillAt(RoundObserver):
    """Keeps the checkpoints a run offers (as bytes, like a file) and stops the run after update ``at``."""

    def __init__(self, at):
        self.at, self.saved = at, None

    def checkpoint(self, result, phase="federated"):
        buf = io.BytesIO()
        torch.save(snapshot(result), buf)
        self.saved = buf.getvalue()

    def round_done(self, rnd, metrics, timing):
        if rnd == self.at:
            raise KeyboardInterrupt


@pytest.mark.parametrize("name,params", [("fedbuff", {"concurrency": 6, "buffer": 2}),
                                         ("fedasync", {"concurrency": 5})])
def test_a_run_killed_mid_queue_resumes_event_for_event(name, params):
    fed = _fed(clients=10, kind="dirichlet")
    train = _train(rounds=9, clock={"latency": "exponential"}, checkpoint_every=3)
    full = Trace()
    ref = simulate(build_algorithm(name, _model(fed), train, params), fed, train, seed=2, observers=[full])
    killer, before = KillAt(5), Trace()
    with pytest.raises(KeyboardInterrupt):
        simulate(build_algorithm(name, _model(fed), train, params), fed, train, seed=2, observers=[before, killer])
    saved = torch.load(io.BytesIO(killer.saved), weights_only=False)
    assert saved["result"].rounds_done == 3 and saved["result"].async_state.in_flight  # clients were in flight
    after = Trace()
    resumed = simulate(build_algorithm(name, _model(fed), train, params), fed, train, seed=2, observers=[after],
                       resume=saved["result"], resume_states=saved["states"])
    assert after.rows == full.rows[3:]
    for k in ref.server.params:
        assert torch.equal(resumed.server.params[k], ref.server.params[k])


class Dispatching(VectorisedExecutor):
    """An executor that, like Flower's, is handed each client's training when the server sends it the model
    (``dispatch``: it computes then, as a node does when the message comes) and asked for the update when it
    arrives (``collect``)."""

    def __init__(self):
        super().__init__()
        self.dispatched = self.collected = 0
        self.trained: list[tuple[int, int]] = []  # (version, client) of every update computed

    def train(self, bc, clients, reduce=False):
        self.trained += [(bc.round, k) for k in clients]
        return super().train(bc, clients, reduce)

    def train_rows(self, bc, clients, rounds):
        self.trained += list(zip(rounds, clients, strict=True))
        return super().train_rows(bc, clients, rounds)

    def dispatch(self, bc, clients):
        self.dispatched += 1
        return [type("Sent", (), {"bc": bc, "clients": list(clients), "upload": self.train(bc, clients)})()]

    def collect(self, sent):
        self.collected += 1
        return sent.upload

    def first_replied(self, sent):  # train.clock.latency = 'wall': here, the one pushed first
        return sent[0]


@pytest.mark.parametrize("name,params", [("fedbuff", {"concurrency": 6, "buffer": 2}),
                                         ("fedasync", {"concurrency": 5})])
def test_clients_dispatched_when_sent_give_the_lazy_stacks_numbers_and_resume_event_for_event(name, params):
    """Pushing a client its training when it is sent (Flower) gives the numbers of training it lazily in a stack:
    a client's update depends on its version and its own streams only. A resumed run's messages in flight are
    gone: the clients sent before the checkpoint train lazily, those sent after are dispatched — the same events."""
    fed = _fed(clients=10, kind="dirichlet")
    train = _train(rounds=9, clock={"latency": "exponential"}, checkpoint_every=3)
    full = Trace()
    ref = simulate(build_algorithm(name, _model(fed), train, params), fed, train, seed=2, observers=[full])
    pushed, trace = Dispatching(), Trace()
    got = simulate(build_algorithm(name, _model(fed), train, params), fed, train, seed=2, executor=pushed,
                   observers=[trace])
    assert pushed.dispatched > 1 and pushed.collected > 1 and trace.rows == full.rows
    killer = KillAt(5)
    with pytest.raises(KeyboardInterrupt):
        simulate(build_algorithm(name, _model(fed), train, params), fed, train, seed=2, executor=Dispatching(),
                 observers=[killer])
    saved = torch.load(io.BytesIO(killer.saved), weights_only=False)
    after, resuming = Trace(), Dispatching()
    resumed = simulate(build_algorithm(name, _model(fed), train, params), fed, train, seed=2, executor=resuming,
                       observers=[after], resume=saved["result"], resume_states=saved["states"])
    assert after.rows == full.rows[3:] and resuming.dispatched > 0
    assert len(set(resuming.trained)) == len(resuming.trained)  # none trained twice (lazily and dispatched)
    for k in ref.server.params:
        torch.testing.assert_close(got.server.params[k], ref.server.params[k], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(resumed.server.params[k], ref.server.params[k], rtol=1e-5, atol=1e-6)


def test_updates_computed_when_the_buffer_is_full_give_the_numbers_of_updates_computed_as_they_arrive(monkeypatch):
    """Lazy updates are computed when a full buffer needs them, every client pending in one stack. Some updates here
    are non-finite, so a full buffer comes up short and the loop takes more arrivals first: the merges, their
    rejections and the model must be those of computing each update when its client is sent (Dispatching, as a
    Flower node does) and reading it when it arrives."""
    from hetfed.executors import asynchronous as loop_module

    fed = _fed(clients=10, kind="dirichlet")
    train = _train(rounds=30, clock={"latency": "lognormal", "spread": 1.0})
    params = {"concurrency": 7, "buffer": 5}  # here a fast client arrives twice (two versions) in one buffer
    short, stacks, settled, twice = [], [], loop_module._settled, []
    rows = VectorisedExecutor.train_rows

    def once_each(self, bc, clients, rounds):
        twice.append(len(set(clients)) < len(clients))
        return rows(self, bc, clients, rounds)

    monkeypatch.setattr(VectorisedExecutor, "train_rows", once_each)

    def spy(*a, **k):
        full = settled(*a, **k)
        short.append(not full)
        return full

    monkeypatch.setattr(loop_module, "_settled", spy)
    runs = []
    for executor in (VectorisedExecutor(), Dispatching()):
        algo = build_algorithm("fedbuff", _model(fed), train, params)
        local = algo.local_update

        def poisoned(bc, states, data, local=local):
            upload, new = local(bc, states, data)
            stacks.append(len(data.seeds))
            bad = [i for i, seed in enumerate(data.seeds) if seed % 9 == 0]  # a pure function of the client's round
            if bad:
                name = next(iter(upload.params))
                values = upload.params[name].clone()
                values[bad] = float("nan")
                upload = dataclasses.replace(upload, params={**upload.params, name: values})
            return upload, new

        algo.local_update = poisoned
        trace = Trace()
        runs.append((simulate(algo, fed, train, seed=3, executor=executor, observers=[trace]), trace))
        stacks.append(None)
    (a, ta), (b, tb) = runs
    assert any(short) and sum(ta.nonfinite) > 0  # a full buffer came up short
    assert twice and not any(twice)  # a client's two updates in one buffer trained one after the other
    assert ta.rows == tb.rows and ta.nonfinite == tb.nonfinite
    for k in a.server.params:
        torch.testing.assert_close(a.server.params[k], b.server.params[k], rtol=1e-5, atol=1e-6)
    lazy = stacks[:stacks.index(None)]
    assert sum(lazy) / len(lazy) >= params["buffer"]  # a stack holds about a buffer's clients, or more


def test_a_wall_clock_run_resumed_sends_its_lost_messages_again():
    """Without a latency model a run's order is the replies'; a resumed run's messages in flight were lost with
    the server, so the clients in flight are sent theirs again (else nothing would ever arrive)."""
    fed = _fed(clients=10, kind="dirichlet")
    train = _train(rounds=9, clock={"latency": "wall"}, checkpoint_every=3)
    params = {"concurrency": 6, "buffer": 2}
    killer = KillAt(5)
    with pytest.raises(KeyboardInterrupt):
        simulate(build_algorithm("fedbuff", _model(fed), train, params), fed, train, seed=2, executor=Dispatching(),
                 observers=[killer])
    saved = torch.load(io.BytesIO(killer.saved), weights_only=False)
    lost = [j for j in saved["result"].async_state.in_flight if j.arrival == math.inf]
    assert lost
    after, resuming = Trace(), Dispatching()
    simulate(build_algorithm("fedbuff", _model(fed), train, params), fed, train, seed=2, executor=resuming,
             observers=[after], resume=saved["result"], resume_states=saved["states"])
    assert [row[0] for row in after.rows] == list(range(4, 10))
    assert {(bc_round, k) for bc_round, k in resuming.trained} >= {(j.version, j.client) for j in lost}
    times = [row[1] for row in after.rows]
    assert times == sorted(times)  # the run's seconds go on


@pytest.mark.parametrize("setting,says", [
    (["methods.0.params.concurrency=11"], "params.concurrency = 11 is not allowed"),
    (["train.client_dropout=0.2"], "train.client_dropout = 0.2 is not allowed with methods.0.algorithm = 'fedbuff'"),
    (["train.clock.deadline=3"], "train.clock.deadline = 3.0 is not allowed"),
    (["train.client_fraction=0.5"], "train.client_fraction = 0.5 is not allowed"),
    (["methods.0.params.buffer=12"], "buffer ≤ concurrency"),
    (["server.min_clients=8"], "server.min_clients = 8 is not allowed"),
    (["privacy.noise_multiplier=1.0"], "privacy.noise_multiplier = 1 with methods.0.algorithm = 'fedbuff' is not"),
    (["train.clock.latency=wall"], "train.clock.latency = 'wall' is not allowed with train.executor = 'vectorised' "
                                   "(methods.0)"),
    (["train.clock.latency=wall", "methods=[{algorithm: fedavg}]"],
     "train.clock.latency = 'wall' is not allowed with train.executor = 'vectorised' (methods.0)"),
    (["train.clock.latency=wall", "train.executor=flower", "methods=[{algorithm: fedavg}]", "train.clock.deadline=2"],
     "train.clock.deadline = 2 is not allowed with train.clock.latency = 'wall'"),
])
def test_what_an_asynchronous_server_cannot_honour_is_refused_in_one_line(tmp_path, capsys, setting, says):
    out = tmp_path / "run"
    args = ["run", "--out", str(out), "--quiet", "--set", "methods=[{algorithm: fedbuff}]"]
    for s in setting:
        args += ["--set", s]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert says in err and not out.exists()


def test_an_asynchronous_run_records_updates_on_the_clock(tmp_path):
    import csv

    out = tmp_path / "run"
    assert main(["run", "--out", str(out), "--quiet", "--set", "methods=[{algorithm: fedbuff}, {algorithm: fedasync}]",
                 "--set", "train.rounds=6", "--set", "train.clock.latency=lognormal"]) == 0
    rows = list(csv.DictReader((out / "metrics.csv").read_text().splitlines()))
    for method in ("fedbuff", "fedasync"):
        sim = [float(r["value"]) for r in rows if r["method"] == method and r["split"] == "train"
               and r["metric"] == "sim_time"]
        assert len(sim) == 6 and all(b >= a for a, b in zip(sim, sim[1:], strict=False)) and sim[0] > 0


def test_the_results_tables_read_accuracy_at_a_time_budget_and_bytes(tmp_path, capsys):
    """results/tables.py clock and bytes (the commands behind results/async and results/compression)."""
    import csv
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("tables",
                                                  Path(__file__).resolve().parents[2] / "results" / "tables.py")
    tables = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tables)
    config = tmp_path / "c.yaml"
    config.write_text("partition: {clients: 6}\ntrain: {rounds: 6, clock: {latency: lognormal}}\nmethods: "
                      "[{name: a_f32, algorithm: fedavg}, {name: a_q4, algorithm: fedavg, server: {compression: "
                      "{kind: qsgd, bits: 4}}}, {name: buff, algorithm: fedbuff, params: {concurrency: 4, buffer: "
                      "2}}]\n")
    out = tmp_path / "sweep"
    assert main(["sweep", str(config), "--seeds", "2", "--out", str(out), "--quiet"]) == 0
    capsys.readouterr()
    run = next(out.glob("**/seed=0"))
    rows = [r for r in csv.DictReader((run / "metrics.csv").read_text().splitlines())
            if r["method"] == "buff" and r["split"] == "summary" and r["client"] == "all"]
    sim = {int(r["round"]): float(r["value"]) for r in rows if r["metric"] == "sim_time"}
    acc = {int(r["round"]): float(r["value"]) for r in rows if r["metric"] == "global_accuracy"}
    budget = sorted(sim.values())[2]
    want = acc[max(k for k, t in sim.items() if t <= budget)]
    assert tables._at(tables._series(run)["buff"], "global_accuracy", "sim_time", budget) == want
    text = tables.clock_table(out, "a_f32", budget, 3)
    assert "| buff |" in text and "n = 2 seeds" in text
    text = tables.bytes_table(out)
    line = next(ln for ln in text.splitlines() if ln.startswith("| a_q4 |"))
    assert float(line.split("|")[2]) < float(next(ln for ln in text.splitlines() if ln.startswith("| a_f32 |"))
                                               .split("|")[2]) / 5  # 4-bit codes: less than a fifth of the bytes


@pytest.mark.slow
def test_on_flowers_simulation_engine_the_asynchronous_servers_give_the_in_process_numbers(tmp_path, monkeypatch):
    """The event loop pushes each client its training message when it sends it the model and pulls the replies when
    the arrival is due, so the nodes train while other messages are out; the clock decides the order in which
    arrivals are merged, so a deterministic latency model gives the in-process events and numbers."""
    pytest.importorskip("flwr")
    import json

    from hetfed.flower.executor import FlowerExecutor

    events: list[tuple[str, int]] = []
    dispatch, collect = FlowerExecutor.dispatch, FlowerExecutor.collect

    def dispatching(self, bc, clients):
        sent = dispatch(self, bc, clients)
        events.extend(("push", id(s)) for s in sent)
        return sent

    def collecting(self, sent):
        events.append(("pull", id(sent)))
        return collect(self, sent)

    monkeypatch.setattr(FlowerExecutor, "dispatch", dispatching)
    monkeypatch.setattr(FlowerExecutor, "collect", collecting)
    common = ["--quiet", "--set", "partition.clients=5", "--set", "train.rounds=5", "--set",
              "train.clock.latency=lognormal", "--set", "methods=[{algorithm: fedbuff, params: {concurrency: 3, "
              "buffer: 2}}, {algorithm: fedasync, params: {concurrency: 3}}]"]
    assert main(["run", "--out", str(tmp_path / "f"), "--set", "train.executor=flower", *common]) == 0
    out, most = set(), 0  # pushes whose replies were not pulled yet
    for kind, sent in events:
        out.add(sent) if kind == "push" else out.discard(sent)
        most = max(most, len(out))
    assert most >= 2 and sum(kind == "pull" for kind, _ in events) >= 5
    assert main(["run", "--out", str(tmp_path / "v"), *common]) == 0
    f, v = (json.loads((tmp_path / d / "summary.json").read_text())["methods"] for d in "fv")
    for method in ("fedbuff", "fedasync"):
        for key in ("global_accuracy", "local_accuracy_mean", "val_loss", "sim_time", "uplink_bytes_total"):
            assert f[method]["final"][key] == pytest.approx(v[method]["final"][key], rel=1e-5), (method, key)


@pytest.mark.slow
def test_on_flower_without_a_latency_model_replies_are_merged_as_they_really_come(tmp_path, monkeypatch):
    """``train.clock.latency: wall``: the server waits for whichever pushed message replies first, its clients
    arrive then, and ``sim_time`` is the run's seconds (nothing to compare with in process: the order is real)."""
    pytest.importorskip("flwr")
    import pandas as pd

    from hetfed.flower.executor import FlowerExecutor

    waited = []
    first_replied = FlowerExecutor.first_replied

    def recording(self, sent):
        waited.append(len(sent))
        return first_replied(self, sent)

    monkeypatch.setattr(FlowerExecutor, "first_replied", recording)
    out = tmp_path / "w"
    assert main(["run", "--quiet", "--out", str(out), "--set", "partition.clients=5", "--set", "train.rounds=6",
                 "--set", "train.clock.latency=wall", "--set", "train.executor=flower", "--set",
                 "methods=[{algorithm: fedbuff, params: {concurrency: 3, buffer: 2}}]"]) == 0
    m = pd.read_csv(out / "metrics.csv")
    train = m[(m.split == "train")].pivot_table(index="round", columns="metric", values="value")
    assert list(train.index) == [1, 2, 3, 4, 5, 6] and (train.clients_aggregated == 2).all()
    assert train.sim_time.is_monotonic_increasing and train.sim_time.iloc[0] > 0
    assert train.staleness_max.max() >= 1 and (train.uplink_bytes > 0).all()
    assert waited and max(waited) >= 2  # it waited on several messages at once, for whichever came first


@pytest.mark.slow
def test_hetfed_run_killed_mid_queue_and_resumed_writes_the_uninterrupted_metrics(tmp_path):
    """SIGKILL an asynchronous run while it writes its second checkpoint; `--resume` continues from the event queue
    it saved, and metrics.csv ends byte for byte as the run that was never killed."""
    from tests.runs.test_resume import _kill_when, _start

    args = ["--quiet", "--set", "partition.clients=6", "--set", "train.rounds=12", "--set", "train.checkpoint_every=3",
            "--set", "train.clock.latency=lognormal", "--set", "methods=[{algorithm: fedbuff, params: "
            "{concurrency: 4, buffer: 2}}, {algorithm: fedasync, params: {concurrency: 4}}]"]
    ref, run = tmp_path / "ref", tmp_path / "run"
    proc = _start(["run", *args, "--out", str(ref)], tmp_path / "ref.progress")
    assert proc.wait() == 0, proc.stderr.read()
    progress = tmp_path / "kill.progress"
    assert _kill_when(_start(["run", *args, "--out", str(run)], progress), progress,
                      lambda lines: lines.count("checkpoint-write") >= 2)
    last = _start(["run", "--quiet", "--resume", str(run)], tmp_path / "resume.progress")
    assert last.wait() == 0, last.stderr.read()
    assert (run / "metrics.csv").read_bytes() == (ref / "metrics.csv").read_bytes()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (run on the GPU machine)")
@pytest.mark.parametrize("name,params", [("fedbuff", {"concurrency": 5, "buffer": 3}),
                                         ("fedasync", {"concurrency": 4, "staleness": "hinge"})])
def test_an_asynchronous_run_on_cuda_gives_the_cpus_events_and_numbers(name, params):
    """The clock, the lazy stacks and QSGD's draws (the clients' counter-based streams) do not depend on the
    device: a GPU run merges the same arrivals at the same simulated times as a CPU run, to float tolerance."""
    from hetfed.config import ServerConfig

    fed = _fed(clients=10, kind="dirichlet")
    server = ServerConfig(compression={"kind": "qsgd", "bits": 4, "bucket": 16, "error_feedback": True})
    runs = []
    for device in ("cpu", "cuda"):
        train = _train(rounds=12, device=device, clock={"latency": "lognormal", "spread": 1.0})
        trace = Trace()
        r = simulate(build_algorithm(name, _model(fed), train, params, server=server), fed, train, seed=5,
                     executor=VectorisedExecutor(), observers=[trace])
        runs.append((r, trace.rows))
    (a, ta), (b, tb) = runs
    assert len(ta) == 12 and max(row[3] for row in ta) > 0 and tb == ta
    for k in a.server.params:
        torch.testing.assert_close(b.server.params[k].cpu(), a.server.params[k].cpu(), rtol=1e-4, atol=1e-5)
