"""A stacked training step recorded once and replayed (#47 §4): on CUDA, a CUDA graph.

A round's step loop launches the same kernels, on tensors of the same shapes, step after step; on a GPU the
launches (dozens per step, each a few microseconds of Python and driver work) cost more than the arithmetic of
an overhead-bound round (the CGAU setting: 23× its captured floor on an H100, ``results/gpu_h100_2026-11-26``).
A CUDA graph records one step's kernels and replays them with one launch.

What a graph can replay is narrow, so the caller guarantees it: the step reads its per-step inputs only from
the static tensors it is given (batch indices, row mask, active flags, the step number as a device scalar), every
other tensor it reads keeps its storage for the whole loop, its effects are in-place writes to tensors that
outlive the loop (parameters, optimiser state, loss sum), and it makes no host round-trip. Everything else a step
depends on (the batch width, whether every client trains, each client's real rows) is the step's *key*: one
graph per key, captured on the key's second occurrence (its first runs eagerly as the warm-up CUDA asks for),
replayed from then on; a key met fewer than ``min_repeats`` times in the plans so far runs eagerly.

The backend is looked up by ``train.capture`` mode and device type in :data:`BACKENDS`: ``auto`` records CUDA
graphs; ``compile`` compiles the step with ``torch.compile`` on a CPU (:class:`Compiled`). Tests register a CPU
stand-in for ``auto`` that calls the step again from its static inputs, which checks the static-input discipline
without a GPU.
"""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import torch

from hetfed.errors import HetfedNote

#: a step: (static inputs, the step number as a 0-d int64 tensor, its key, host values) → None; effects in place
Step = Callable[[Sequence[torch.Tensor], torch.Tensor, Any, Any], None]


class Recorder(Protocol):
    """One recorded step: ``record`` captures it (without running it), ``replay`` runs what was captured."""

    def record(self, step: Callable[[], None]) -> None: ...
    def replay(self) -> None: ...


class CudaGraph:
    """:class:`torch.cuda.CUDAGraph` as a :class:`Recorder`.

    Recorded with ``capture_begin``/``capture_end`` on a side stream rather than the ``torch.cuda.graph``
    context, which synchronises the device and empties the allocator's cache at every capture: a round records
    a step or two per stack, and an emptied cache makes the rest of the round allocate from the driver again.

    The capture forbids unsafe CUDA calls (a ``cudaMalloc``, a synchronisation) on its own thread only
    (``thread_local``, as torch's own CUDA-graph trees capture): in a stacked sweep each run's server works on
    its own thread while the sweep's thread records the runs' client steps, and CUDA's default (``global``)
    failed those runs whose server allocated during a capture (a lent H200, 2026-12-04: runs under attack).
    """

    #: a key is recorded once it has come up this many times (its first run is the eager warm-up CUDA asks for)
    min_repeats = 3

    def __init__(self) -> None:
        self._graph = torch.cuda.CUDAGraph()

    def record(self, step: Callable[[], None]) -> None:
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._graph.capture_begin(capture_error_mode="thread_local")
            try:
                step()
            finally:
                self._graph.capture_end()
        torch.cuda.current_stream().wait_stream(side)

    def replay(self) -> None:
        self._graph.replay()

    @staticmethod
    def warm_up() -> AbstractContextManager[object]:
        """A side stream for the first, eager run of a key (lazy initialisations must not land in a capture)."""
        return _SideStream()


class _SideStream:
    def __enter__(self) -> object:
        self._side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        self._side.wait_stream(torch.cuda.current_stream())
        self._ctx = torch.cuda.stream(self._side)
        return self._ctx.__enter__()  # type: ignore[no-untyped-call]

    def __exit__(self, *exc: object) -> None:
        self._ctx.__exit__(*exc)
        torch.cuda.current_stream().wait_stream(self._side)


class Compiled:
    """A step compiled by ``torch.compile`` (inductor: C++ kernels on a CPU) as a :class:`Recorder`: one graph of
    the forward, ``torch.autograd.grad``'s backward and the optimiser's update, with its elementwise work fused.

    Why on a CPU: a small model's step (the CGAU setting: 10 clients × 32 rows of a 64-64-64 MLP) is ~60 operator
    calls, each a few microseconds of dispatch and autograd bookkeeping around microseconds of arithmetic; compiled,
    the same step costs ~0.45× the eager one (``benchmarks/engine.py --compile``). Compiling a key costs ~15–45 s the
    first time on a machine (inductor builds C++ with the system's compiler; this project's 2-core CPU) and ~1 s
    once torch's cache holds it (``/tmp/torchinductor_<user>``, across processes), so this is
    ``train.capture: compile``, asked for by runs or sweeps long enough to win it back, and ``auto`` only for runs
    of :data:`COMPILE_PAYS_AFTER_ROUNDS` rounds or more (:func:`resolve`). The
    numbers are the eager step's to float tolerance (inductor fuses and reorders float arithmetic), not bit for
    bit; the dropout streams' integer hashing is exact.

    Every recording compiles the same function (:class:`hetfed.engine.local._Step`'s call), so torch keeps their
    graphs on one code object. Compiling needs two of dynamo's settings other than the process's: tracing
    ``torch.autograd.grad`` into the graph, and a recompile limit of :data:`RECOMPILE_LIMIT` (one per key of the
    kept steps). They are set for a call that compiles and put back after it; a replay whose graph is made runs
    without them (setting them costs ~30 µs, a tenth of a step), and one that finds it must compile after all
    (dynamo refuses before running anything: ``fullgraph``) is run again with them.
    """

    #: a key is compiled once it has come up this many times in the rounds' plans (a round's few steps of a rare
    #: shape are not worth seconds of compiling)
    min_repeats = 20

    #: torch's graphs of the step function reached :data:`RECOMPILE_LIMIT` in this process: said once
    limit_noted = False

    @staticmethod
    def missing() -> str | None:
        """What compiling lacks on this machine (None: nothing)."""
        if compiler_missing():
            return "torch.compile builds a CPU step's kernels with a C++ compiler and none was found (g++, or $CXX)"
        return None

    @staticmethod
    def refuses(model: Any) -> str:
        """Why this recorder cannot record ``model``'s steps ("" where it can): dynamo must trace its forward."""
        return str(model.no_compile)

    def record(self, step: Callable[[], None]) -> None:
        assert isinstance(step, partial)
        self._step = step
        self._compiled = torch.compile(step.func, fullgraph=True, dynamic=False)
        self._made = False
        self._eager = False

    def replay(self) -> None:
        step = self._step
        if self._eager:
            step()
            return
        if self._made:
            try:
                self._compiled(*step.args, **step.keywords)
                return
            # a guard failed, and tracing anew needs the settings (the process's recompile limit may be below the
            # graphs the step function has)
            except (torch._dynamo.exc.TorchDynamoException, torch._dynamo.exc.FailOnRecompileLimitHit):
                pass
        config = torch._dynamo.config
        before = config.trace_autograd_ops, config.recompile_limit
        config.trace_autograd_ops, config.recompile_limit = True, max(before[1], RECOMPILE_LIMIT)
        try:
            with torch._inductor.config.patch(realize_opcount_threshold=REALIZE_OPCOUNT):
                self._compiled(*step.args, **step.keywords)
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            # the process has compiled the step function's limit of graphs (a long sweep of changing shapes): this
            # shape runs eagerly (dynamo refused before running anything)
            self._eager = True
            if not Compiled.limit_noted:
                Compiled.limit_noted = True
                warnings.warn(f"train.capture = 'compile': this process has compiled {RECOMPILE_LIMIT} step shapes "
                              "(torch's limit for one function); steps of new shapes run eagerly", HetfedNote,
                              stacklevel=2)
            step()
        finally:
            config.trace_autograd_ops, config.recompile_limit = before
        self._made = True


#: graphs kept per step function by :class:`Compiled` (hetfed.engine.local keeps 8 steps of up to 8 keys each)
RECOMPILE_LIMIT = 64

#: inductor's ``realize_opcount_threshold`` while :class:`Compiled` compiles: a pointwise value of more operations
#: than this, read by several kernels, is computed once into a buffer instead of inlined into each. Why: a step with
#: dropout hashes its masks' streams (dozens of integer operations a value), which inductor's CPU default (50)
#: inlined into every kernel that reads them, and generating their C++ took ~65 s a step shape on a 2-core CPU;
#: with 4, 15–17 s, the compiled step no slower; without dropout the same either way
#: (``results/benchmarks_cpu_2026-11-30f``)
REALIZE_OPCOUNT = 4

#: ``train.capture`` mode → device type → the recorder class that captures steps there
BACKENDS: dict[str, dict[str, type]] = {"auto": {"cuda": CudaGraph}, "compile": {"cpu": Compiled}}


def compiler_missing() -> bool:
    """Whether ``torch.compile`` lacks the C++ compiler it builds a CPU graph's kernels with (``g++``, or ``$CXX``
    as torch's inductor looks for it): without one, ``train.capture: compile`` would fail at its first graph."""
    from torch._inductor import cpp_builder

    try:
        cpp_builder.get_cpp_compiler()
    except Exception:  # inductor's InvalidCxxCompiler, or any failure to run the compiler
        return True
    return False


#: the rounds from which ``train.capture: auto`` compiles a CPU run's steps (#74 §4). Measured on this project's
#: 2-core CPU (docs/scale.md § compiled steps): compiling costs ~45 s a graph the first time on a machine (~95 s for a
#: method of the default experiment, two graphs), and saves 0.35–0.6 ms a round of the overhead-bound CGAU setting
#: (``benchmarks/engine.py --compile``: eager / compiled 1.07–1.12) and ~2–4 ms of the default experiment's: it
#: pays after ~25 000–45 000 rounds. Below this, and where no C++ compiler is found, ``auto`` runs eagerly on a CPU.
#: Since remeasured (2026-12-01, docs/scale.md § compiled steps): compiling still gains where a step does elementwise
#: work besides its layers (dropout, CGAU's gates: eager / compiled 1.2–1.4) but loses on a plain MLP without dropout
#: (0.79–0.90, its eager step now written out): ``auto`` compiles only the steps of a model that gains
#: (``Model.compile_gains``; ``LocalSchedule.chosen`` in :mod:`hetfed.engine.local`).
COMPILE_PAYS_AFTER_ROUNDS = 30_000


def device_of(kind: str) -> torch.device:
    """``train.device`` as a device: ``auto`` is CUDA where there is one, else the CPU (what every part of a run that
    asks reads: the loop's device, and whether ``train.capture: auto`` compiles)."""
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if kind == "auto" else kind)


def resolve(mode: str, device: str, rounds: int) -> str:
    """``train.capture`` as a run of ``rounds`` rounds on ``train.device`` ``device`` applies it: ``auto`` becomes
    ``compile`` for a CPU run long enough to win its compiling back (:data:`COMPILE_PAYS_AFTER_ROUNDS`) when a C++
    compiler is there; every other case is the mode as set (``auto``: CUDA graphs on a GPU, eager on a CPU)."""
    if mode != "auto" or rounds < COMPILE_PAYS_AFTER_ROUNDS:
        return mode
    return "compile" if device_of(device).type == "cpu" and not compiler_missing() else mode


#: ``train.capture`` modes that leave a device without a recorder to eager steps (``auto`` records where it can);
#: any other mode asks for its recorder and is refused where there is none
WHERE_AVAILABLE = {"auto", "off"}


def backend(mode: str, device: torch.device) -> type | None:
    """The recorder for ``train.capture`` ``mode`` on ``device`` (None: its steps run eagerly)."""
    return BACKENDS.get(mode, {}).get(device.type)


def refuses(recorder: type, model: Any) -> str:
    """Why ``recorder`` cannot record ``model``'s steps ("" where it can; a recorder without ``refuses`` records every
    model's): such a model's steps run eagerly, and a run that asked for the recorder by name is refused."""
    check = getattr(recorder, "refuses", None)
    return check(model) if check is not None else ""


def refusal(mode: str, device: torch.device) -> str | None:
    """Why ``train.capture`` ``mode`` cannot apply on ``device`` (None: it can): a mode that asks for a recorder the
    device lacks, or one whose recorder lacks what it needs there (``missing()``: compile's C++ compiler)."""
    recorder = backend(mode, device)
    if recorder is None:
        if mode in WHERE_AVAILABLE:
            return None
        return f"it records steps on {sorted(BACKENDS.get(mode, {}))} only, not on a {device.type} device"
    missing = getattr(recorder, "missing", None)
    return missing() if missing is not None else None


@dataclass
class _Slot:
    inputs: list[torch.Tensor]  # the static inputs the recorded step reads
    step: torch.Tensor  # 0-d int64: the step number
    recorder: Recorder | None = None


class StepGraphs:
    """The step loop's recorded steps, one per key that recurs enough in the plan to pay for its capture."""

    def __init__(self, step: Step, keys: Sequence[Hashable], device: torch.device, min_repeats: int | None = None,
                 max_graphs: int = 8, recorder: type | None = None):
        self._step = step
        self._device = device
        self._backend = recorder if recorder is not None else BACKENDS["auto"][device.type]
        self._min_repeats = min_repeats if min_repeats is not None else getattr(self._backend, "min_repeats", 3)
        self._max_graphs = max_graphs
        self._slots: dict[Hashable, _Slot] = {}
        self._seen: Counter[Hashable] = Counter()
        self.replays = 0  # steps run from a recording (for tests and benchmarks)
        self.plan(keys)

    def plan(self, keys: Sequence[Hashable]) -> None:
        """The keys of the steps to come (a later call's): which are worth recording; recordings already made
        are replayed whenever their key comes up. A key is counted over every call this recording served (the
        rounds of a run): a round's last, shorter batch comes up once or twice a round, and a run's rounds
        together pay for its recording."""
        counts = Counter(keys)
        self._seen.update(counts)
        ranked = sorted(counts, key=lambda k: -self._seen[k])[:self._max_graphs]
        frequent = [k for k in ranked if self._seen[k] >= self._min_repeats]
        self._eligible = set(frequent) | {k for k in self._slots if k in counts}

    def run(self, key: Hashable, t: int, inputs: Sequence[torch.Tensor], host: Any = None) -> bool:
        """Run step ``t`` (its per-step ``inputs``) from a recording if its key has one or gets one now;
        False: the caller runs it eagerly. ``host``: host values the step is given; a recording keeps those of
        the step it was recorded at, so the key must determine every one the step's kernels depend on."""
        if key not in self._eligible:
            return False
        slot = self._slots.get(key)
        if slot is None:  # first time: static copies of the inputs, one eager run as the warm-up
            slot = _Slot([x.clone() for x in inputs], torch.zeros((), dtype=torch.int64, device=self._device))
            slot.step.fill_(t)  # a kernel with a scalar argument: no host-to-device copy
            self._slots[key] = slot
            warm = getattr(self._backend, "warm_up", nullcontext)
            with warm():
                self._step(slot.inputs, slot.step, key, host)
            return True
        for static, x in zip(slot.inputs, inputs, strict=True):
            static.copy_(x)
        slot.step.fill_(t)
        if slot.recorder is None:
            recorder: Recorder = self._backend()
            # a partial (not a lambda): a stand-in recorder can see which step, and with what, it records
            recorder.record(partial(self._step, slot.inputs, slot.step, key, host))
            slot.recorder = recorder
        slot.recorder.replay()
        self.replays += 1
        return True
