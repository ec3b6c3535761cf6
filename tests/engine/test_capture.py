"""A stacked step recorded once and replayed (train.capture, #47 §4): captured = eager.

On CUDA the recording is a CUDA graph (the tests marked ``cuda``, run wherever a GPU is present). On a CPU a
stand-in recorder (registered for the test) runs the step again from the recording's static inputs: it checks
that every per-step input reaches a replay through the static tensors and the step's key (batch rows, masks,
active flags, the step number of the dropout streams), and that the keys, warm-up and capture order give the
eager loop's numbers bit for bit. It cannot check what only a real graph enforces (that every effect is an
in-place write): the CUDA tests do.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable

import numpy as np
import pytest
import torch

from hetfed.config import OptimizerConfig, build_config
from hetfed.engine import capture, local
from hetfed.engine.local import LocalSchedule, Proximal, train_stack
from hetfed.engine.types import ClientData
from hetfed.models import MLP, closed_form

CUDA = torch.cuda.is_available()


class Replay:
    """A CPU recorder: recording keeps the step (without running it, as a capture does); a replay runs it.

    A CUDA graph reads the tensors its step read when it was recorded, whatever the step's attributes point to
    later: the stand-in keeps a shallow copy of the step as it was then (its tensors, not their values), so a later
    call that replaces a tensor the step reads, instead of writing into it, is not seen by a replay here either.
    """

    replays = 0
    records = 0

    def record(self, step: Callable[[], None]) -> None:
        Replay.records += 1
        assert isinstance(step, functools.partial)
        self._step = functools.partial(copy.copy(step.func), *step.args, **step.keywords)

    def replay(self) -> None:
        Replay.replays += 1
        self._step()


def same_update_as_replays(monkeypatch) -> None:
    """Eager steps that update their weights as a replayed step does: through the optimiser. (An eager plain SGD step
    written out in closed form moves its weights in the backward, :mod:`hetfed.models.closed_form`: the same update
    to float rounding; a recorded step, which may hold finished clients masked, never does.)"""
    monkeypatch.setattr(closed_form, "MOVE_FROM", 1 << 40)


@pytest.fixture
def recorded_on_cpu(monkeypatch):
    same_update_as_replays(monkeypatch)
    monkeypatch.setitem(capture.BACKENDS["auto"], "cpu", Replay)
    monkeypatch.setattr(local, "_RECORDED", type(local._RECORDED)())
    Replay.replays = Replay.records = 0
    return Replay


def _data(sizes: list[int], d: int = 6, device: str = "cpu") -> ClientData:
    gen = torch.Generator().manual_seed(0)
    total = sum(sizes)
    x, y = torch.randn(total, d, generator=gen), torch.randint(0, 4, (total,), generator=gen)
    bounds = np.cumsum([0, *sizes])
    idx = [np.arange(bounds[i], bounds[i + 1]) for i in range(len(sizes))]
    return ClientData(list(range(len(sizes))), x.to(device), y.to(device), idx, [11 * k + 3 for k in range(len(sizes))])


def _stack(model: MLP, n: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    return {s.name: torch.stack([s.init(gen, s.shape) for _ in range(n)]).to(device) for s in model.specs()}


CASES = {
    "sgd momentum, dropout, unequal clients": (OptimizerConfig(lr=0.1, momentum=0.9), None),
    "adam": (OptimizerConfig(kind="adam", lr=0.01), None),
    "proximal term (FedProx, Ditto)": (OptimizerConfig(lr=0.1, momentum=0.0), 0.5),
}


def _train(sizes, opt, mu, capture_on: bool | str, device: str = "cpu", epochs: float = 3):
    model = MLP(6, [16, 8], 4, dropout=0.3)
    params = _stack(model, len(sizes), device)
    centre = {k: v[0] for k, v in params.items()}
    reg = Proximal(centre, mu) if mu else None
    mode = capture_on if isinstance(capture_on, str) else ("auto" if capture_on else "off")
    sched = LocalSchedule(batch_size=8, epochs=epochs, capture=mode)
    return train_stack(model, params, _data(sizes, device=device), sched, opt, opt.lr, regulariser=reg)


@pytest.mark.parametrize("case", list(CASES))
def test_replayed_steps_give_the_eager_loops_numbers_bit_for_bit(recorded_on_cpu, case):
    opt, mu = CASES[case]
    sizes = [37, 12, 50, 3, 24]  # partial last batches, clients that finish early: several keys per round
    eager = _train(sizes, opt, mu, capture_on=False)
    assert recorded_on_cpu.replays == 0
    replayed = _train(sizes, opt, mu, capture_on=True)
    assert recorded_on_cpu.replays > 10  # most steps came from a recording
    for a, b in zip(eager, replayed, strict=True):
        if isinstance(a, dict):
            assert a.keys() == b.keys()
            for k in a:
                assert torch.equal(a[k], b[k]), k
        else:
            assert torch.equal(a, b)


def _three_rounds(device: str, records: Callable[[], int]) -> None:
    """Round after round (new parameters, proximal centre, client seeds; the same model, data and shapes), the
    steps recorded in earlier calls are replayed with the new values: the eager numbers. A key is recorded once
    the rounds have met it three times and replayed from its next occurrence (a key met once a round is recorded
    in the fourth), and never recorded again."""
    model = MLP(6, [16, 8], 4, dropout=0.3)
    data = _data([37, 12, 50, 3, 24], device=device)
    opt = OptimizerConfig(lr=0.1, momentum=0.9)
    results = {}
    made: list[int] = []
    for on in (False, True):
        params = _stack(model, 5, device)
        out = []
        for rnd in range(5):
            sched = LocalSchedule(batch_size=8, epochs=2, capture="auto" if on else "off")
            round_data = ClientData(data.client_ids, data.x, data.y, data.indices, [s + 7 * rnd for s in data.seeds])
            centre = {k: v.mean(0) for k, v in params.items()}
            params, state, loss = train_stack(model, params, round_data, sched, opt, 0.1,
                                              regulariser=Proximal(centre, 0.3))
            out.append((params, state, loss))
            if on:
                made.append(records())
        results[on] = out
    assert made[0] > 0 and made[3] == made[4]  # the fifth round recorded nothing
    close = torch.equal if device == "cpu" else (lambda a, b: torch.allclose(a, b, rtol=1e-6, atol=1e-6))
    for (pa, sa, la), (pb, sb, lb) in zip(results[False], results[True], strict=True):
        assert all(close(pa[k], pb[k]) for k in pa) and all(close(sa[k], sb[k]) for k in sa)
        assert close(la, lb)


def test_recordings_are_kept_for_the_next_rounds_and_give_their_numbers(recorded_on_cpu):
    _three_rounds("cpu", lambda: recorded_on_cpu.records)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_cuda_graphs_are_kept_for_the_next_rounds_and_give_their_numbers(monkeypatch):
    recorded = [0]
    real = capture.CudaGraph.record

    def counting(self, step):
        recorded[0] += 1
        real(self, step)

    monkeypatch.setattr(capture.CudaGraph, "record", counting)
    _three_rounds("cuda", lambda: recorded[0])


class _Weighted:
    """A method's loss with per-client tensors of its own: each client's cross-entropy after adding its logit
    offsets ``inputs["shift"]`` [n, C], scaled by ``inputs["weight"]`` [n] (as FedRoD's balanced softmax reads
    each client's class counts). ``seen``: how many clients each call computed."""

    def __init__(self, model: MLP):
        self.model, self.seen = model, []

    def loss(self, params, xb, yb, mask, noise, inputs):
        self.seen.append(inputs["weight"].shape[0])
        logits = self.model.forward(params, xb, noise) + inputs["shift"][:, None, :]
        return local.client_mean(local.row_cross_entropy(logits, yb), mask) * inputs["weight"]

    def closure(self, inputs):
        """The same loss as a plain objective closing over the whole stack's tensors (computes every client)."""
        return lambda params, xb, yb, mask, noise: self.loss(params, xb, yb, mask, noise, inputs)


def _objective_rounds(device: str, declared: bool, mode: str, rounds: int = 5, sizes=(37, 12, 50, 3, 24)):
    """Rounds of a stack trained on :class:`_Weighted`'s loss whose per-client tensors change every round: as a
    :class:`StackObjective` (``declared``) or a closure; ``mode``: ``train.capture``."""
    model = MLP(6, [16, 8], 4, dropout=0.3)
    data = _data(list(sizes), device=device)
    opt, params, weighted, out = OptimizerConfig(lr=0.1, momentum=0.9), _stack(model, 5, device), _Weighted(model), []
    gen = torch.Generator().manual_seed(5)
    for rnd in range(rounds):
        inputs = {"shift": torch.randn(5, 4, generator=gen).to(device),
                  "weight": (torch.rand(5, generator=gen) + 0.5).to(device)}
        objective = local.StackObjective(weighted.loss, inputs) if declared else weighted.closure(inputs)
        round_data = ClientData(data.client_ids, data.x, data.y, data.indices, [s + 7 * rnd for s in data.seeds])
        sched = LocalSchedule(batch_size=8, epochs=2, capture=mode)
        params, state, loss = train_stack(model, params, round_data, sched, opt, 0.1, objective=objective)
        out.append((params, state, loss))
    return out, weighted.seen


def test_a_declared_objective_computes_only_the_clients_still_training_and_its_steps_are_recorded(recorded_on_cpu):
    """#74: a method's loss with per-client tensors (FedRoD's class counts) declared as a StackObjective steps as
    the cross-entropy does — longest plans first, only the clients still training computed, recorded and replayed
    round after round with each round's tensors — and gives the numbers of the closure that computes every client
    eagerly, bit for bit."""
    closure, every = _objective_rounds("cpu", declared=False, mode="auto")
    assert set(every) == {5} and recorded_on_cpu.records == 0  # a closure: every client, eagerly
    declared, seen = _objective_rounds("cpu", declared=True, mode="auto")
    assert min(seen) < 5 and recorded_on_cpu.records > 0 and recorded_on_cpu.replays > 20
    for (pa, sa, la), (pb, sb, lb) in zip(closure, declared, strict=True):
        assert all(torch.equal(pa[k], pb[k]) for k in pa) and all(torch.equal(sa[k], sb[k]) for k in sa)
        assert torch.equal(la, lb)


def test_a_declared_objective_with_an_input_not_one_row_per_client_is_refused_in_one_line():
    """A method that declares a tensor shared by the whole stack (not ``[n, ...]``) would have it cut and reordered
    as if it were each client's: refused, naming the input and its shape."""
    from hetfed.errors import RunError

    model = MLP(6, [16, 8], 4)
    weighted = _Weighted(model)
    wrong = local.StackObjective(weighted.loss, {"shift": torch.zeros(4), "weight": torch.ones(5)})
    with pytest.raises(RunError, match=r"one row per client of the stack \(5\): \{'shift': \(4,\)\}"):
        train_stack(model, _stack(model, 5), _data([37, 12, 50, 3, 24]), LocalSchedule(batch_size=8),
                    OptimizerConfig(lr=0.1), 0.1, objective=wrong)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_a_declared_objectives_cuda_graphs_give_the_eager_numbers():
    eager, _ = _objective_rounds("cuda", declared=True, mode="off")
    replayed, _ = _objective_rounds("cuda", declared=True, mode="auto")
    for (pa, sa, la), (pb, sb, lb) in zip(eager, replayed, strict=True):
        assert all(torch.allclose(pa[k], pb[k], rtol=1e-5, atol=1e-6) for k in pa)
        assert all(torch.allclose(sa[k], sb[k], rtol=1e-5, atol=1e-6) for k in sa)
        assert torch.allclose(la, lb, rtol=1e-5, atol=1e-6)


def test_a_recording_is_not_reused_for_other_data_or_another_model(recorded_on_cpu):
    opt = OptimizerConfig(lr=0.1)
    sched = LocalSchedule(batch_size=8, epochs=2, capture="auto")
    model = MLP(6, [16, 8], 4)
    train_stack(model, _stack(model, 5), _data([37, 12, 50, 3, 24]), sched, opt, 0.1)
    made = recorded_on_cpu.records
    train_stack(model, _stack(model, 5), _data([37, 12, 50, 3, 24]), sched, opt, 0.1)  # a new data tensor
    assert recorded_on_cpu.records > made
    made = recorded_on_cpu.records
    other = MLP(6, [16, 8], 4)
    data = _data([37, 12, 50, 3, 24])
    train_stack(other, _stack(other, 5), data, sched, opt, 0.1)
    assert recorded_on_cpu.records > made
    # only the latest data's recordings are kept (an earlier run's pool is not held alive)
    assert local._RECORDED and all(step.data.x is data.x for step, _ in local._RECORDED.values())
    local.forget_recorded()
    assert not local._RECORDED


def test_a_key_met_fewer_times_than_a_capture_pays_for_runs_eagerly(recorded_on_cpu):
    calls: list[int] = []

    def step(inputs, t, key, host):
        calls.append(int(t))

    x = torch.zeros(2)
    graphs = capture.StepGraphs(step, ["a", "a", "a", "b", "b"], torch.device("cpu"), min_repeats=3)
    ran = [graphs.run(k, t, [x]) for t, k in enumerate(["a", "a", "a", "b", "b"])]
    assert ran == [True, True, True, False, False]
    # "a": an eager warm-up (step 0), then recorded (not run) and replayed for steps 1 and 2
    assert calls == [0, 1, 2] and graphs.replays == 2


def test_a_key_is_counted_over_the_calls_a_recording_serves(recorded_on_cpu):
    """A round's last, shorter batch comes up once or twice a round: it is recorded once the rounds together have
    met it ``min_repeats`` times (the steps recorded so far are replayed whenever they come up)."""
    calls: list[str] = []

    def step(inputs, t, key, host):
        calls.append(key)

    x = torch.zeros(2)
    round_keys = ["a", "a", "a", "b", "b"]
    graphs = capture.StepGraphs(step, round_keys, torch.device("cpu"), min_repeats=3)
    assert [graphs.run(k, t, [x]) for t, k in enumerate(round_keys)] == [True, True, True, False, False]
    graphs.plan(round_keys)  # the next round: "b" has now come up 4 times
    assert [graphs.run(k, t, [x]) for t, k in enumerate(round_keys)] == [True] * 5
    assert graphs.replays == 2 + 3 + 1  # "b": a warm-up, then recorded and replayed once


def test_the_step_number_and_inputs_reach_a_replay_through_the_static_tensors(recorded_on_cpu):
    seen: list[tuple[int, float]] = []

    def step(inputs, t, key, host):
        seen.append((int(t), float(inputs[0].sum())))

    graphs = capture.StepGraphs(step, ["k"] * 4, torch.device("cpu"))
    for t in range(4):
        graphs.run("k", t, [torch.full((3,), float(t))])
    assert seen == [(0, 0.0), (1, 3.0), (2, 6.0), (3, 9.0)]


def test_capture_off_and_cpu_runs_never_record():
    """Without a recorder for the device (a CPU here), or with train.capture = off, every step is eager."""
    assert capture.backend("auto", torch.device("cpu")) is None
    assert build_config({}, {"train": {"capture": "off"}}).train.capture == "off"
    assert LocalSchedule.from_train(build_config({}, {"train": {"capture": "off"}}).train).capture == "off"
    assert LocalSchedule.from_train(build_config({}, {}).train).capture == "auto"


#: runs whose steps are recorded: the default experiment and the methods whose losses declare their tensors
RECORDED_RUNS = [
    {},
    # FedRoD's loss reads each client's class counts (a StackObjective), on unequal Dirichlet clients
    {"methods": [{"name": "fedrod", "algorithm": "fedrod"}], "partition": {"kind": "dirichlet", "alpha": 0.3}},
    # FedProto's reads its run's global prototypes, new every round
    {"methods": [{"name": "fedproto", "algorithm": "fedproto"}, {"name": "fedlc", "algorithm": "fedlc"}],
     "partition": {"kind": "dirichlet", "alpha": 0.3}},
    # FedCP draws its policy's noise from the step's streams; GPFL reads its run's class embeddings; APFL clips its
    # α in place after every step
    {"methods": [{"name": "fedcp", "algorithm": "fedcp"}, {"name": "gpfl", "algorithm": "gpfl"},
                 {"name": "apfl", "algorithm": "apfl"}], "partition": {"kind": "dirichlet", "alpha": 0.3}},
    # SCAFFOLD's correction and FedDyn's linear term: a Proximal term's shift, new every round; MOON's frozen models
    {"methods": [{"name": "scaffold", "algorithm": "scaffold"}, {"name": "feddyn", "algorithm": "feddyn"},
                 {"name": "moon", "algorithm": "moon"}], "partition": {"kind": "dirichlet", "alpha": 0.3}},
    # pFedMe's inner solver writes its θ in place (a StackObjective's output), carried from step to step;
    # Per-FedAvg's meta-step differentiates inside its loss (Hessian-free: a second-order product); FedDBE's
    # running mean is written in place each step and uploaded (round 1 fixes the global mean its MR then reads);
    # FedALA's weights W learn over each client's own, received and local tensors, clipped in place
    {"methods": [{"name": "pfedme", "algorithm": "pfedme"}, {"name": "perfedavg", "algorithm": "perfedavg"},
                 {"name": "perfedavg_hf", "algorithm": "perfedavg", "params": {"variant": "hf"}},
                 {"name": "feddbe", "algorithm": "feddbe", "params": {"kappa": 0.5}},
                 {"name": "fedala", "algorithm": "fedala"}],
     "partition": {"kind": "dirichlet", "alpha": 0.3}},
    # Floco draws its simplex point from the step's streams, in each client's subregion from round 2; pFedFDA's
    # heads are fixed tensors of the step; FedEM's M-step reads the received models and the mixture weights
    {"methods": [{"name": "floco", "algorithm": "floco"}, {"name": "pfedfda", "algorithm": "pfedfda"},
                 {"name": "fedem", "algorithm": "fedem"}], "partition": {"kind": "dirichlet", "alpha": 0.3}},
    # Fed-FSNet's KL term on its run's synthetic D′ (β per round), FedGen's teaching term on generated features
    {"methods": [{"name": "fsnet", "algorithm": "fsnet"},
                 {"name": "fedgen", "algorithm": "fedgen", "params": {"server_steps": 5}}],
     "partition": {"kind": "dirichlet", "alpha": 0.3}},
    # FedAS's alignment pass reads each client's own prototypes (from round 1, its previous body's); FedPAC's body
    # reads its run's class centroids, which the server sends from round 2
    {"methods": [{"name": "fedas", "algorithm": "fedas"}, {"name": "fedpac", "algorithm": "fedpac"}],
     "partition": {"kind": "dirichlet", "alpha": 0.3}},
]
RECORDED_RUN_IDS = ["default", "fedrod", "fedproto-fedlc", "fedcp-gpfl-apfl", "scaffold-feddyn-moon",
                    "pfedme-perfedavg-feddbe-fedala", "floco-pfedfda-fedem", "fsnet-fedgen", "fedas-fedpac"]


def _finals(tmp_path, overrides: dict, **train) -> dict[str, dict[str, dict]]:
    """Each method's final metrics of a three-round run with ``train.capture`` off and auto."""
    from hetfed.runs.runner import run_experiment

    finals = {}
    for mode in ("off", "auto"):
        cfg = build_config({}, {**overrides, "train": {"rounds": 3, "capture": mode, **train}})
        summary = run_experiment(cfg, out=tmp_path / mode, progress=False).summary
        finals[mode] = {m: v["final"] for m, v in summary["methods"].items()}
    return finals


@pytest.mark.parametrize("overrides", RECORDED_RUNS, ids=RECORDED_RUN_IDS)
def test_a_run_with_recorded_steps_matches_an_eager_run(recorded_on_cpu, tmp_path, overrides):
    """The default experiment (CGAU and ReLU MLPs with dropout 0.5) and the methods whose losses declare their
    per-client tensors, three rounds, both ways: the same metrics."""
    finals = _finals(tmp_path, overrides)
    assert recorded_on_cpu.replays > 0
    assert finals["auto"] == finals["off"]


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("overrides", RECORDED_RUNS[1:], ids=RECORDED_RUN_IDS[1:])
def test_a_cuda_run_of_declared_objectives_with_graphs_matches_an_eager_cuda_run(monkeypatch, tmp_path, overrides):
    """The methods whose losses declare their per-client tensors, recorded as CUDA graphs (FedCP draws its noise
    inside a recorded step; pFedMe writes its θ in place): the eager CUDA run's metrics."""
    same_update_as_replays(monkeypatch)
    made: list[capture.StepGraphs] = []
    real = capture.StepGraphs
    monkeypatch.setattr(capture, "StepGraphs", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    finals = _finals(tmp_path, overrides, device="cuda")
    assert made and sum(g.replays for g in made) > 0
    differ = {(m, k): (finals["auto"][m][k], v) for m, metrics in finals["off"].items() for k, v in metrics.items()
              if v is not None and finals["auto"][m][k] != pytest.approx(v, rel=1e-5, abs=1e-5)}
    assert not differ, differ


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("case", list(CASES))
def test_cuda_graph_replays_give_the_eager_loops_numbers(monkeypatch, case):
    same_update_as_replays(monkeypatch)
    made: list[capture.StepGraphs] = []
    real = capture.StepGraphs
    monkeypatch.setattr(capture, "StepGraphs", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    opt, mu = CASES[case]
    sizes = [37, 12, 50, 3, 24]
    eager = _train(sizes, opt, mu, capture_on=False, device="cuda")
    assert not made
    replayed = _train(sizes, opt, mu, capture_on=True, device="cuda")
    assert made and made[0].replays > 10
    for a, b in zip(eager, replayed, strict=True):
        if isinstance(a, dict):
            for k in a:
                torch.testing.assert_close(a[k], b[k], rtol=1e-6, atol=1e-6)
        else:
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_a_cuda_run_with_graphs_matches_an_eager_cuda_run(monkeypatch, tmp_path):
    from hetfed.runs.runner import run_experiment

    same_update_as_replays(monkeypatch)
    finals = {}
    for mode in ("off", "auto"):
        cfg = build_config({}, {"train": {"rounds": 5, "capture": mode, "device": "cuda"}})
        summary = run_experiment(cfg, out=tmp_path / mode, progress=False).summary
        finals[mode] = {m: v["final"] for m, v in summary["methods"].items()}
    for m, metrics in finals["off"].items():
        for k, v in metrics.items():
            if v is not None:
                assert finals["auto"][m][k] == pytest.approx(v, abs=1e-5), (m, k)


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_a_round_of_replayed_steps_never_synchronises(monkeypatch):
    """Recording and replaying add no host round-trip to the step loop (the eager loop's own check: test_streams)."""
    from tests.engine.test_streams import train_without_synchronising

    model = MLP(6, [16, 8], 4, dropout=0.3)
    train_without_synchronising(monkeypatch, model, _stack(model, 5, "cuda"), _data([37, 12, 50, 3, 24], device="cuda"),
                                LocalSchedule(batch_size=8, epochs=3, capture="auto"))


@pytest.mark.skipif(not CUDA, reason="needs CUDA")
def test_another_thread_may_allocate_and_read_back_while_a_step_is_recorded():
    """A stacked sweep's runs do their servers' work on their own threads while the sweep's thread records their
    client steps: a run allocating fresh GPU memory (a cudaMalloc) and reading a number back during a capture must
    not fail (it did under CUDA's ``global`` capture mode: three runs under attack on a lent H200, 2026-12-04)."""
    import threading

    asked, done = threading.Event(), threading.Event()
    seen: list[object] = []

    def server() -> None:
        asked.wait(30)
        try:
            fresh = torch.ones(50_000_003, dtype=torch.float64, device="cuda")  # a size not in the cache: a cudaMalloc
            seen.append(float(fresh.sum().item()))
        except BaseException as err:  # noqa: BLE001  (the failure is what the test reports)
            seen.append(err)
        done.set()

    x = torch.zeros(8, device="cuda")
    graph = capture.CudaGraph()

    def step() -> None:
        asked.set()
        assert done.wait(30)
        x.add_(1.0)

    worker = threading.Thread(target=server)
    worker.start()
    with capture.CudaGraph.warm_up():
        pass
    graph.record(step)
    worker.join()
    assert seen == [50_000_003.0]
    graph.replay()
    graph.replay()
    assert x.tolist() == [2.0] * 8


@pytest.mark.parametrize(("rounds", "device", "compiler", "expected"), [
    (capture.COMPILE_PAYS_AFTER_ROUNDS, "cpu", True, "compile"),   # long enough, a compiler: compiled
    (capture.COMPILE_PAYS_AFTER_ROUNDS - 1, "cpu", True, "auto"),  # too short to win the compiling back: eager
    (capture.COMPILE_PAYS_AFTER_ROUNDS, "cpu", False, "auto"),     # no C++ compiler: eager, not a failure
    (capture.COMPILE_PAYS_AFTER_ROUNDS, "cuda", True, "auto"),     # CUDA graphs on a GPU, whatever the length
])
def test_auto_compiles_a_cpu_run_only_when_it_is_long_enough_to_pay(monkeypatch, rounds, device, compiler, expected):
    """#74 §4: ``train.capture: auto`` on a CPU picks ``compile`` when a C++ compiler is present and the run is long
    enough to pay for compiling; the schedule every executor reads carries the resolved mode."""
    monkeypatch.setattr(capture, "compiler_missing", lambda: not compiler)
    train = build_config({"train": {"rounds": rounds, "device": device}}).train
    assert LocalSchedule.from_train(train).capture == expected
    off = build_config({"train": {"rounds": rounds, "device": device, "capture": "off"}}).train
    assert LocalSchedule.from_train(off).capture == "off"  # a mode the user set is applied as set
    assert LocalSchedule.from_train(train).chosen == (expected != "auto")


@pytest.mark.parametrize(("dropout", "chosen", "compiled"), [
    (0.0, True, False),  # auto chose compile, and a plain MLP's compiled step is slower: eager
    (0.3, True, True),   # with dropout to fuse, compiling gains: compiled
    (0.0, False, True),  # compile asked for: applied
])
def test_auto_compiles_only_a_model_whose_compiled_step_is_faster(monkeypatch, dropout, chosen, compiled):
    """#74 §4, remeasured 2026-12-01: a plain MLP's written-out eager step beats its compiled one (0.79–0.90×), one
    with dropout does not (1.28×); ``auto`` compiles a long CPU run's steps only for a model that gains."""
    monkeypatch.setattr(local, "_RECORDED", type(local._RECORDED)())
    monkeypatch.setattr(capture.Compiled, "min_repeats", 10**9)  # whether the step is recorded, not compiled now
    model = MLP(6, [16, 8], 4, dropout=dropout)
    assert model.compile_gains == (dropout > 0)
    schedule = LocalSchedule(batch_size=8, epochs=2, capture="compile", chosen=chosen)
    train_stack(model, _stack(model, 3), _data([13, 20, 9]), schedule, OptimizerConfig(lr=0.1), 0.1)
    assert bool(local._RECORDED) == compiled
