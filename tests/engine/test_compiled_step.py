"""``train.capture: compile``: the stacked step compiled by ``torch.compile`` on a CPU (#47 §4).

Compiled steps give the eager loop's numbers to float tolerance (inductor fuses and reorders float arithmetic;
the dropout streams' integer hashing must be exact, or a unit dropped in one and kept in the other would move the
numbers by far more than the tolerance); a recording is kept for the next rounds; a setting that cannot apply is
refused. Compiling takes seconds per step shape (~45 s for the first in a process on this project's CPU, cold), so
these tests are few and marked slow.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from hetfed.config import OptimizerConfig, build_config, load_config
from hetfed.engine import capture, local
from hetfed.engine.local import LocalSchedule, Proximal, train_stack
from hetfed.errors import ConfigError
from hetfed.executors.simulate import resolve_device
from hetfed.models import MLP
from tests.engine.test_capture import _data, _stack

pytestmark = [pytest.mark.skipif(capture.compiler_missing(), reason="torch.compile needs a C++ compiler (g++)")]


@pytest.fixture(autouse=True)
def fresh_recordings(monkeypatch):
    monkeypatch.setattr(local, "_RECORDED", type(local._RECORDED)())
    # compile a key as soon as it recurs, so that a few short rounds exercise the compiled path
    monkeypatch.setattr(capture.Compiled, "min_repeats", 3)
    compiled = []
    real = capture.Compiled.record

    def counting(self, step):
        compiled.append(step)
        real(self, step)

    monkeypatch.setattr(capture.Compiled, "record", counting)
    return compiled


def _rounds(mode: str, opt: OptimizerConfig, mu: float, rounds: int = 3):
    """Three rounds of a stack of unequal clients (clients that finish early), each round
    with new seeds and a new proximal centre: what a run's rounds give the kept recordings."""
    model = MLP(6, [16, 8], 4, dropout=0.3)
    data = _data([13, 13, 13, 40, 40])  # one batch width (8), partial batches, two widths of stack: two keys
    params = _stack(model, 5)
    out = []
    for rnd in range(rounds):
        round_data = dataclasses.replace(data, seeds=[s + 7 * rnd for s in data.seeds])
        reg = Proximal({k: v.mean(0) for k, v in params.items()}, mu) if mu else None
        params, state, loss = train_stack(model, params, round_data, LocalSchedule(8, 3.0, capture=mode), opt,
                                          opt.lr, regulariser=reg)
        out.append((params, state, loss))
    return out


CASES = {
    "sgd momentum, dropout": (OptimizerConfig(lr=0.1, momentum=0.9), 0.0),
    "adam, proximal term (FedProx, Ditto)": (OptimizerConfig(kind="adam", lr=0.01), 0.5),
}


def _close(eager: list, compiled: list) -> None:
    """Each round's parameters, optimiser state and loss, compiled against eager, to float tolerance."""
    for (pa, sa, la), (pb, sb, lb) in zip(eager, compiled, strict=True):
        for k in pa:
            torch.testing.assert_close(pb[k], pa[k], rtol=1e-5, atol=1e-6)
        for k in sa:
            torch.testing.assert_close(sb[k], sa[k], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(lb, la, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_compiled_steps_give_the_eager_numbers_round_after_round(fresh_recordings, case):
    opt, mu = CASES[case]
    eager = _rounds("off", opt, mu)
    assert not fresh_recordings
    compiled = _rounds("compile", opt, mu)
    assert fresh_recordings, "no step was compiled"
    made = len(fresh_recordings)
    _close(eager, compiled)
    # the rounds reused one kept step, and each of its keys was compiled once
    assert len(local._RECORDED) == 1
    keys = [step.args[2] for step in fresh_recordings]
    assert len(set(keys)) == len(keys) == made


@pytest.mark.slow
def test_a_declared_objectives_compiled_steps_give_the_eager_numbers(fresh_recordings):
    """A method's loss that declares its per-client tensors (a StackObjective: FedRoD's, MOON's …) is compiled under
    ``train.capture: compile`` as the cross-entropy's step is: round after round, with new per-client tensors each
    round, the eager numbers to float tolerance."""
    from tests.engine.test_capture import _objective_rounds

    eager, _ = _objective_rounds("cpu", declared=True, mode="off", rounds=3, sizes=(13, 13, 13, 40, 40))
    assert not fresh_recordings
    compiled, _ = _objective_rounds("cpu", declared=True, mode="compile", rounds=3, sizes=(13, 13, 13, 40, 40))
    assert fresh_recordings, "no step was compiled"
    _close(eager, compiled)


def test_a_replay_that_must_compile_again_is_given_the_settings_and_leaves_them_as_they_were():
    """A compiled graph whose guard fails (an attribute the step reads changed) is traced again, which needs
    dynamo's ``torch.autograd.grad`` tracing: the replay runs it with the settings and puts them back."""

    class Step:
        scale = 1.0

        def __call__(self, w: torch.Tensor, out: torch.Tensor) -> None:
            leaf = w.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad((leaf * leaf).sum() * self.scale, [leaf])
            out.copy_(grad)

    from functools import partial

    step, w, out = Step(), torch.arange(4.0), torch.zeros(4)
    config = torch._dynamo.config
    before = config.trace_autograd_ops, config.recompile_limit
    recorder = capture.Compiled()
    recorder.record(partial(step, w, out))
    recorder.replay()
    assert torch.equal(out, 2 * w)
    step.scale = 3.0
    recorder.replay()
    assert torch.equal(out, 6 * w)
    assert (config.trace_autograd_ops, config.recompile_limit) == before
    # the same when the process's own recompile limit is below the graphs the function already has
    step.scale = 5.0
    with torch._dynamo.config.patch(recompile_limit=1):
        recorder.replay()
        assert config.recompile_limit == 1
    assert torch.equal(out, 10 * w)


def test_past_torchs_limit_of_graphs_a_new_shape_runs_eagerly_with_one_note(monkeypatch):
    """torch keeps every recording's graphs on the one step function, up to a limit per process (a long sweep of
    changing shapes could reach it): a shape beyond it runs eagerly, said once, instead of failing the run."""
    from functools import partial

    from hetfed.errors import HetfedNote

    monkeypatch.setattr(capture, "RECOMPILE_LIMIT", 1)
    monkeypatch.setattr(capture.Compiled, "limit_noted", False)

    def square_grad(w: torch.Tensor, out: torch.Tensor) -> None:
        leaf = w.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad((leaf * leaf).sum(), [leaf])
        out.copy_(grad)

    torch._dynamo.reset()  # this test's function starts with no graphs
    with torch._dynamo.config.patch(recompile_limit=1), \
            pytest.warns(HetfedNote, match="steps of new shapes run eagerly") as noted:
        for n in (3, 4, 5):  # one graph, then two shapes past the limit
            w, out = torch.arange(float(n)), torch.zeros(n)
            recorder = capture.Compiled()
            recorder.record(partial(square_grad, w, out))
            recorder.replay()
            assert torch.equal(out, 2 * w)
    assert len([w for w in noted if issubclass(w.category, HetfedNote)]) == 1


def test_compile_on_a_device_without_a_compiled_recorder_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(ConfigError) as err:
        resolve_device("cuda", "compile")
    message = str(err.value)
    assert "train.capture = 'compile'" in message and "cuda" in message and "['auto', 'off']" in message
    assert resolve_device("cpu", "compile") == torch.device("cpu")
    assert build_config({}, {"train": {"capture": "compile"}}).train.capture == "compile"


def test_compile_without_a_cpp_compiler_is_refused_up_front(monkeypatch):
    from torch._inductor import cpp_builder

    def missing() -> str:
        raise FileNotFoundError("g++")

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", missing)
    assert capture.compiler_missing()
    with pytest.raises(ConfigError, match=r"train.capture = 'compile' is not allowed here .*C\+\+ compiler"):
        resolve_device("cpu", "compile")
    assert resolve_device("cpu", "auto") == torch.device("cpu")


def test_the_cli_refuses_compile_on_cuda_in_one_line_before_making_a_run_directory(tmp_path, monkeypatch, capsys):
    from hetfed.cli import main

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    out = tmp_path / "run"
    assert main(["run", "--set", "train.capture=compile", "--set", "train.device=cuda", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "train.capture = 'compile'" in err
    assert not out.exists()


@pytest.mark.slow
def test_a_run_with_compiled_steps_matches_an_eager_run(tmp_path, fresh_recordings):
    """The default experiment's methods — the ReLU MLP and CGAU, dropout 0.5, unequal clients, a sampled cohort —
    three rounds both ways: the same metrics to float tolerance. (CGAU's compiled step failed: its layers read a
    ContextVar, which dynamo cannot trace.)"""
    from hetfed.runs.runner import run_experiment

    finals = {}
    for mode in ("off", "compile"):
        cfg = load_config(str(Path(__file__).resolve().parents[2] / "configs" / "default.yaml"),
                          ["train.rounds=3", f"train.capture={mode}"])
        summary = run_experiment(cfg, out=tmp_path / mode, progress=False).summary
        finals[mode] = summary["methods"]
    assert {type(step.func.model).__name__ for step in fresh_recordings} == {"MLP", "CGAUNet"}
    assert set(finals["off"]) == {"relu", "cgau"}
    for method, final in finals["off"].items():
        for k, v in final["final"].items():
            if isinstance(v, float):
                assert finals["compile"][method]["final"][k] == pytest.approx(v, abs=1e-5), (method, k)


def test_a_model_the_compiler_cannot_trace_trains_eagerly_with_the_eager_numbers(fresh_recordings):
    """``auto`` becomes ``compile`` for long CPU runs; a model that declares it cannot be compiled
    (``Model.no_compile``: the LoRA encoder) then steps eagerly — nothing compiled, the eager numbers to the bit."""

    class Untraceable(MLP):
        no_compile = "its forward reads a ContextVar"

    model = Untraceable(6, [16, 8], 4, dropout=0.3)
    data, opt = _data([13, 13, 13, 40, 40]), OptimizerConfig(lr=0.1, momentum=0.9)
    runs = [train_stack(model, _stack(model, 5), data, LocalSchedule(8, 3.0, capture=mode), opt, opt.lr)
            for mode in ("off", "compile")]
    assert not fresh_recordings
    (params, state, loss), (params_c, state_c, loss_c) = runs
    assert all(torch.equal(params[k], params_c[k]) for k in params)
    assert all(torch.equal(state[k], state_c[k]) for k in state)
    assert torch.equal(loss, loss_c)


@pytest.mark.parametrize("kind", ["bilstm", "charlstm"])
def test_the_lstms_declare_they_cannot_be_compiled_and_step_eagerly_under_compile(kind, fresh_recordings):
    """Dynamo refuses both (the BiLSTM reads its batch's longest text on the host, the character LSTM runs torch's
    fused LSTM): each failed at its first compiled step; declared (``Model.no_compile``), they step eagerly."""
    from hetfed.engine.types import ClientData
    from hetfed.models.bilstm import BiLSTM
    from hetfed.models.charlstm import CharLSTM

    model = BiLSTM(8, 30, 3, embedding_dim=8, hidden=8) if kind == "bilstm" else CharLSTM(8, 30, 30, 8, hidden=16)
    assert model.no_compile
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randint(1, 30, (80, 8), generator=gen).float(), torch.randint(0, 3, (80,), generator=gen)
    data = ClientData([0, 1], x, y, [np.arange(0, 40), np.arange(40, 80)], [3, 14])
    opt = OptimizerConfig(lr=0.1)
    runs = [train_stack(model, _stack(model, 2), data, LocalSchedule(8, 2.0, capture=mode), opt, opt.lr)
            for mode in ("off", "compile")]
    assert not fresh_recordings
    assert all(torch.equal(runs[0][0][k], runs[1][0][k]) for k in runs[0][0])
