"""Every model kind's stacked step traces whole with dynamo (``train.capture: compile``'s first stage), or the model
declares it cannot be compiled (``Model.no_compile``) — checked with dynamo's ``eager`` backend, which traces the step
as ``compile`` does but runs the graph without inductor's C++ (seconds, not the minute a compiled shape costs). Three
models failed at their first compiled step before they declared it (a ContextVar, a host read, torch's fused LSTM);
a new model kind is checked here the day it is registered."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hetfed.config import ModelConfig, OptimizerConfig
from hetfed.engine import capture, local
from hetfed.engine.local import LocalSchedule, train_stack
from hetfed.engine.types import ClientData
from hetfed.models import build_model
from hetfed.registry import registry_of

#: the inputs a kind reads → a small shape of them, their range (token and character ids) and a vocabulary size
INPUTS = {"features": ((16, 16), None), "tokens": ((8,), 30), "characters": ((8,), 30)}


def _kinds() -> list[str]:
    return [n for n in registry_of("model").names() if registry_of("model").get(n).inputs in INPUTS]


@pytest.mark.parametrize("kind", _kinds())
def test_every_model_kinds_step_traces_whole_or_the_model_says_it_cannot_be_compiled(kind, monkeypatch):
    shape, vocab = INPUTS[registry_of("model").get(kind).inputs]
    model = build_model(ModelConfig(kind=kind), shape, 3, vocab)
    if model.no_compile:
        return  # such a model steps eagerly under compile (tests/engine/test_compiled_step.py)
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: real(fn, **{**kw, "backend": "eager"}))
    monkeypatch.setattr(local, "_RECORDED", type(local._RECORDED)())
    monkeypatch.setattr(capture.Compiled, "min_repeats", 1)
    made: list = []
    record = capture.Compiled.record
    monkeypatch.setattr(capture.Compiled, "record", lambda self, step: made.append(step) or record(self, step))
    gen = torch.Generator().manual_seed(0)
    n = 2 * 16
    x = (torch.randint(0, vocab, (n, *shape), generator=gen).float() if vocab
         else torch.randn(n, *shape, generator=gen))
    data = ClientData([0, 1], x, torch.randint(0, 3, (n,), generator=gen), [np.arange(0, 16), np.arange(16, 32)],
                      [3, 14])
    params = {s.name: torch.stack([s.init(gen, s.shape) for _ in range(2)]) for s in model.specs()}
    opt = OptimizerConfig(lr=0.1, momentum=0.9)
    eager = train_stack(model, params, data, LocalSchedule(8, 2.0, capture="off"), opt, opt.lr)
    # dynamo refusing any part of the step raises here
    traced = train_stack(model, params, data, LocalSchedule(8, 2.0, capture="compile"), opt, opt.lr)
    assert made, f"model.kind = {kind!r}: no step was traced"
    for k in eager[0]:
        torch.testing.assert_close(traced[0][k], eager[0][k], rtol=1e-5, atol=1e-6)
