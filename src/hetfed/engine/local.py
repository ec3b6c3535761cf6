"""Local training of a stack of clients: the shared inner loop of every method.

Each client's batches come from its own counter-based stream (keyed by its round
seed, drawn on the device for the whole stack: :mod:`hetfed.streams`), so the plan
is the same whatever it is stacked with and on whatever device. Clients of unequal size do
unequal numbers of steps: the stack runs the longest plan. A plain step (the model's cross-entropy, at most a
proximal term) puts the stack's clients longest plan first and computes, at each step, only the first ones, those
still training (views of the stack's tensors, updated in place): the round's client-steps are the sequential
ones, batched. Any other step computes the whole stack and masks the clients that finished (their parameters and
optimiser state stand still). A short last batch is padded with masked rows. The loss of each client is the mean
over its real rows.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

import torch

from hetfed import streams
from hetfed.config import OptimizerConfig, RecordPrivacyConfig, TrainConfig
from hetfed.engine import capture, optim, record_dp
from hetfed.engine.stacks import computed_clients
from hetfed.engine.step_plan import StepPlan, plan_steps
from hetfed.engine.types import ClientData, index_on, take_rows
from hetfed.errors import RunError
from hetfed.models import closed_form, sgd_in_backward
from hetfed.models.base import Model, Noise, Params, prefixed, under, without

# each row's cross-entropy: the name the methods' objectives import from here
from hetfed.models.softmax import row_cross_entropy as row_cross_entropy

#: An extra loss term per client ``[n]``, e.g. FedProx's proximal term.
Regulariser = Callable[[Params], torch.Tensor]
#: each client's training loss ``[n]`` of stacked params on a batch ``(x, y, row mask, noise)`` (default: the
#: model's cross-entropy, averaged over the client's real rows), or ``(objective, reported)`` when the loss
#: the client reports differs from the one it descends (APFL reports f(w), Per-FedAvg the meta-loss)
Objective = Callable[[Params, torch.Tensor, torch.Tensor, torch.Tensor, Noise], torch.Tensor]
#: a map applied to the trained parameters after every step (a constraint)
Projection = Callable[[Params], Params]


@dataclass(frozen=True)
class InPlace:
    """A projection that writes into the trained tensors it is given instead of returning new ones (APFL keeps α
    in [0, 1] by ``clamp_``): the step stays in place, so it is cut to the clients still training and recorded."""

    apply: Callable[[Params], None]


@dataclass(frozen=True)
class StackObjective:
    """An :data:`Objective` whose only tensors of the stack are ``inputs`` (each ``[n, ...]``, the stack's clients
    in order), passed to ``loss`` as its last argument.

    Why: a plain :data:`Objective` may close over tensors of the whole stack in the caller's order, so its steps
    compute every client, finished or not, and run eagerly. With its per-client tensors declared, the stack
    reorders and slices them with its own (only the clients still training compute) and a recording keeps them as
    it keeps the parameters (its next calls load theirs in place): such a step is recorded, a CUDA graph on a GPU.
    ``loss`` must read nothing else that changes between calls — a bound method of the algorithm (its model, its
    constants), never a closure over a round's tensors: the recording is kept for the calls with an equal ``loss``.
    ``outputs`` names the inputs the loss writes in place, a state it carries from step to step (pFedMe's θ, which
    a client without rows in a step keeps): the stack writes its own copies and hands them back (:meth:`written`).
    """

    loss: Callable[..., torch.Tensor | tuple[torch.Tensor, torch.Tensor]]
    inputs: Params
    outputs: tuple[str, ...] = ()

    def held(self) -> Params:
        """``inputs`` as the step holds them, among its fixed tensors under :data:`DECLARED`; the outputs copied."""
        return {DECLARED + k: v.clone() if k in self.outputs else v for k, v in self.inputs.items()}

    def written(self, trained: Params) -> tuple[Params, Params]:
        """The trained tensors :func:`train_stack` returned, without the outputs, and the outputs' final values."""
        out = {DECLARED + k: k for k in self.outputs}
        return {k: v for k, v in trained.items() if k not in out}, {out[k]: v for k, v in trained.items() if k in out}

    def on(self, fixed: Params) -> tuple[Objective, Params]:
        """The objective over the inputs held in a step's ``fixed`` tensors, and the others (the model's)."""
        inputs = under(fixed, DECLARED)
        rest = without(fixed, DECLARED)
        return cast(Objective, partial(self.loss, inputs=inputs)), rest  # Objective: a loss or (loss, reported)


#: the prefix of a :class:`StackObjective`'s inputs among a step's fixed tensors (no parameter's name has a colon)
DECLARED = "objective:"


def client_mean(rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each client's mean ``[n]`` of a per-row quantity ``[n, batch]`` over its real rows (``mask``: 1 real, 0
    padding; a client without rows gets 0): the loss an objective returns."""
    return (rows * mask).sum(1) / mask.sum(1).clamp(min=1)


def cross_entropy(model: Model, params: Params, xb: torch.Tensor, yb: torch.Tensor, mask: torch.Tensor,
                  noise: Noise | None = None) -> torch.Tensor:
    """Each client's mean cross-entropy ``[n]`` over its real rows (``mask`` [n, batch]: 1 real, 0 padding)."""
    return client_mean(row_cross_entropy(model.forward(params, xb, noise), yb), mask)


@dataclass(frozen=True)
class LocalSchedule:
    """How much local work: epochs E or steps τ, batch size B."""

    batch_size: int
    epochs: float | None = 1.0
    steps: int | None = None
    cap_one_pass: bool = False
    #: ``train.capture`` as the run applies it (:func:`hetfed.engine.capture.resolve`): replay the stacked step from a
    #: recording where the device and the step allow it (auto: a CUDA graph; compile: ``torch.compile`` on a CPU,
    #: what ``auto`` becomes for a CPU run long enough to pay for it; off: eager)
    capture: str = "auto"
    #: record-level DP in every step (``privacy.record``: DP-SGD, :mod:`hetfed.engine.record_dp`), or None
    records: RecordPrivacyConfig | None = None
    #: ``capture`` is what ``auto`` chose for this run, not what was asked: a model whose compiled step is slower
    #: (``Model.compile_gains``) then steps eagerly; one that asked for ``compile`` gets it
    chosen: bool = False

    @classmethod
    def from_train(cls, cfg: TrainConfig, records: RecordPrivacyConfig | None = None) -> LocalSchedule:
        mode = capture.resolve(cfg.capture, cfg.device, cfg.rounds)
        return cls(cfg.batch_size, cfg.local_epochs, cfg.local_steps, cfg.steps_cap_one_pass, mode, records,
                   chosen=mode != cfg.capture)

    def one_epoch(self) -> LocalSchedule:
        """One pass over each client's data, B and the capture switch kept (a personal or mixture phase)."""
        return dataclasses.replace(self, epochs=1.0, steps=None, cap_one_pass=False)

    def extra_pass(self, batch_size: int) -> LocalSchedule:
        """:meth:`one_epoch` in batches of ``batch_size``, without record-level DP: a method's own extra pass (FedAS's
        alignment, FedMoE's phases), recorded as this schedule's steps are (the mode as the run applies it, whether
        ``auto`` chose it)."""
        return dataclasses.replace(self.one_epoch(), batch_size=batch_size, records=None)

    def planned_steps(self, sizes: Sequence[int]) -> list[int]:
        """Each client's local steps this round by its size (0 for a client without data: it does not train)."""
        return [self.n_steps(m) if m else 0 for m in sizes]

    def samples_seen(self, n: int) -> int:
        """How many of its ``n`` samples a client's round goes over: all of them for an epoch or more, else its steps'
        batches (what an attack on its update is scored against)."""
        return min(n, self.n_steps(n) * self.batch_size)

    def n_steps(self, n: int) -> int:
        """A client's local steps for ``n`` samples (remembered: a stacked sweep asks for every client of every run
        several times a round)."""
        return _n_steps(self.batch_size, self.epochs, self.steps, self.cap_one_pass, n)


@functools.lru_cache(maxsize=1 << 16)
def _n_steps(batch_size: int, epochs: float | None, steps: int | None, cap_one_pass: bool, n: int) -> int:
    per_epoch = max(1, math.ceil(n / batch_size))
    if steps is not None:
        return min(steps, per_epoch) if cap_one_pass else steps
    return max(1, round((epochs or 1.0) * per_epoch))


@dataclass(frozen=True)
class Proximal:
    """``weight/2 · ‖θ − centre‖² + ⟨shift, θ⟩`` per client over the centre's and shift's parameters (FedProx's μ,
    Ditto's λ; SCAFFOLD's correction ``c − c_i`` and FedDyn's ``−∇L_k`` are shifts).

    Its gradient ``weight · (θ − centre) + shift`` is known, so :func:`train_stack` adds it to the step's gradients
    directly instead of building an autograd graph over every stacked parameter at every step (that graph
    made Ditto's personal pass cost ~1.4× a plain pass), and the step stays plain: cut to the clients still
    training, recorded on a GPU. ``centre``'s and ``shift``'s tensors broadcast against the stack (unstacked
    ``[...]`` or stacked ``[n, ...]``).
    """

    centre: Params
    weight: float
    shift: Params = field(default_factory=dict)

    def add_gradient(self, grads: Params, params: Params) -> Params:
        out = {k: g.add(params[k] - self.centre[k], alpha=self.weight) if k in self.centre else g
               for k, g in grads.items()}
        return {k: g + self.shift[k] if k in self.shift else g for k, g in out.items()}

    def per_client(self, fn: Callable[[torch.Tensor], torch.Tensor], like: Params) -> Proximal:
        """This term with ``fn`` applied to its centres and shifts stacked like ``like`` (``[n, ...]``: a client's
        own); one a dimension less is the same for every client and stays."""
        def each(d: Params) -> Params:
            return {k: fn(v) if k in like and v.ndim == like[k].ndim else v for k, v in d.items()}

        return Proximal(each(self.centre), self.weight, each(self.shift))

    def tensors(self) -> Params:
        """Its centres and shifts under names of their own (what a recording keeps and reloads)."""
        return {**prefixed(self.centre, "centre."), **prefixed(self.shift, "shift.")}


def train_stack(
    model: Model,
    params: Params,
    data: ClientData,
    schedule: LocalSchedule,
    opt_cfg: OptimizerConfig,
    lr: float,
    opt_state: Params | None = None,
    regulariser: Regulariser | Proximal | None = None,
    trainable: list[str] | None = None,
    objective: Objective | StackObjective | None = None,
    project: Projection | InPlace | None = None,
) -> tuple[Params, Params, torch.Tensor]:
    """Train stacked ``params`` on each client's data; returns (params, opt state, mean loss).

    ``trainable`` names the parameters that move (default: all of ``params``);
    the others are inputs held fixed (e.g. a frozen global model in a mixture).
    ``regulariser`` adds a loss term per client (a :class:`Proximal` term by its closed-form gradient).
    ``objective`` replaces the model's cross-entropy per row (APFL trains two models on one batch; a
    :class:`StackObjective` steps as compactly as the cross-entropy); ``project`` constrains the parameters after
    every step. A plain step under SGD moves its large linear weights in the backward
    (:mod:`hetfed.models.sgd_in_backward`: the same update).
    """
    device = data.x.device
    objective = _private(model, schedule, objective)
    params, trainable, hidden = _holding(objective, params, trainable)
    buffers = set(model.buffer_names)  # updated by the forward, never by a gradient
    simple = _stack_own(objective, regulariser, project, len(data.client_ids)) and not buffers
    compacts = simple and len(data.client_ids) > 1
    order = longest_first(data, schedule) if compacts else None
    if order is not None:
        params, opt_state, regulariser, data = _reordered(order, params, opt_state, regulariser, data)
    # a method's copy of the model (APFL's local model ``apfl.local.<name>``) has the model's buffers under a prefix
    names = [k for k in (trainable if trainable is not None else list(params))
             if k not in buffers and not any(k.endswith("." + b) for b in buffers)]
    fixed = {k: v for k, v in params.items() if k not in names}
    current, state = _own(params, names, opt_state, opt_cfg, copied=order is not None)
    proximal = regulariser if isinstance(regulariser, Proximal) else None
    term = term_of(regulariser)
    plan = plan_steps(data, schedule, device)
    # a recording replays kernels on fixed storage: only a step whose every effect is in place can be one
    recorder = _recorder(model, schedule, device) if simple else None
    keys = _step_keys(plan, model.reads_rows, compacts, recorder is not None)
    closed, moves = _update_path(model, current, opt_cfg, proximal) if simple and objective is None else (None, 0)
    step = _Step(model, data, plan.keys, fixed, current, state, torch.zeros(len(data.client_ids), device=device),
                 opt_cfg, lr, objective, term, proximal, project,
                 streams.RoundDraws(plan.keys, len(plan.widths), streams.DROPOUT_MASK), moves=moves, closed=closed)
    graphs = None
    if recorder is not None:
        step, graphs = _recorded(step, keys, recorder)
    for t, key in enumerate(keys):
        w, c = key[0], key[3]
        inputs = (plan.index[:c, t, :w], plan.mask[:c, t, :w], plan.active[t, :c])
        rows = plan.rows[t][:c]
        if graphs is None or not graphs.run(key, t, inputs, rows):
            step(inputs, t, key, rows)
    out = _handed_out(order, graphs is not None, device)
    trained = {k: out(v) for k, v in {**step.fixed, **step.current}.items() if k not in hidden}
    return trained, {k: out(v) for k, v in step.state.items()}, out(step.loss_sum / plan.steps)


def _recorder(model: Model, schedule: LocalSchedule, device: torch.device) -> type | None:
    """What records this run's steps of ``model`` (None: they run eagerly): the schedule's recorder for the device,
    unless it cannot record the model, or ``auto`` chose to compile and the model's compiled step is the slower
    (``Model.compile_gains``)."""
    recorder = capture.backend(schedule.capture, device)
    if recorder is None or capture.refuses(recorder, model) or (schedule.chosen and not model.compile_gains):
        return None
    return recorder


def _private(model: Model, schedule: LocalSchedule, objective: Objective | StackObjective | None
             ) -> Objective | StackObjective | None:
    """Under record-level DP (``schedule.records``) the step's objective is DP-SGD's: the model's cross-entropy
    clipped per sample and noised; otherwise ``objective`` as it is."""
    if schedule.records is None:
        return objective
    if objective is not None:  # the plan admits record-level DP only for methods of plain steps
        raise RunError("privacy.record: DP-SGD clips the model's cross-entropy per sample; this step has an "
                       "objective of its own")
    return record_dp.private_objective(model, schedule.records.noise_multiplier or 0.0, schedule.records.clip,
                                       schedule.batch_size)


def _holding(objective: Objective | StackObjective | None, params: Params, trainable: list[str] | None
             ) -> tuple[Params, list[str] | None, set[str]]:
    """The stack's tensors and the trained names, a :class:`StackObjective`'s inputs held fixed among them (the
    stack's own: reordered, cut, recorded and loaded as its parameters are), and those not handed back (all but
    its outputs)."""
    if not isinstance(objective, StackObjective):
        return params, trainable, set()
    held = objective.held()
    hidden = set(held) - {DECLARED + k for k in objective.outputs}
    return {**params, **held}, trainable if trainable is not None else list(params), hidden


def _stack_own(objective: Objective | StackObjective | None, regulariser: Regulariser | Proximal | None,
               project: Projection | InPlace | None, clients: int) -> bool:
    """Whether every input of a step is the stack's own, so that it can compute only the clients still training
    (longest plans first) and be recorded: no objective, term or projection of the caller's, which may hold tensors
    of the whole stack in the caller's order — unless the objective declares them (one row per client: checked, a
    method's error) and the projection writes in place."""
    if isinstance(objective, StackObjective):
        wrong = {k: tuple(v.shape) for k, v in objective.inputs.items() if v.ndim == 0 or v.shape[0] != clients}
        if wrong:
            raise RunError(f"a StackObjective's inputs must have one row per client of the stack ({clients}): {wrong}")
    declared = objective is None or isinstance(objective, StackObjective)
    return declared and term_of(regulariser) is None and (project is None or isinstance(project, InPlace))


def _update_path(model: Model, current: Params, opt_cfg: OptimizerConfig, proximal: Proximal | None
                 ) -> tuple[closed_form.ClosedForm | None, int]:
    """How a plain step training ``current`` (any others held fixed) computes and applies its update: the
    model's gradients written out where it has them (no autograd, whose fixed cost is most of a small step), and the
    fewest clients for its SGD to move weights in the backward (the closed form moves every weight; autograd's hook
    only large ones, for its own cost; 0: never — also under a proximal shift, which a weight moved in the backward
    would not fold in)."""
    closed = model.closed_form(set(current))
    if opt_cfg.kind != "sgd" or (proximal is not None and proximal.shift):
        return closed, 0
    if closed is not None:
        return closed, 1
    return None, sgd_in_backward.fewest_clients([v[0].numel() for v in current.values() if v.ndim == 3])


def _own(params: Params, names: list[str], opt_state: Params | None, opt_cfg: OptimizerConfig, copied: bool
         ) -> tuple[Params, Params]:
    """The trained parameters and optimiser state as the step's own tensors: the optimiser updates them in place, and
    the caller's stay untouched (``copied``: they are copies already, a reordered stack's)."""
    current = {k: params[k] if copied else params[k].detach().clone(memory_format=torch.contiguous_format)
               for k in names}
    if opt_state is None:
        return current, optim.init_state(opt_cfg, current)
    return current, {k: v if copied else v.clone() for k, v in opt_state.items()}


def _step_keys(plan: StepPlan, reads_rows: bool, compacts: bool, recorded: bool
               ) -> list[tuple[int, bool, Any, int]]:
    """Each step's key ``(batch width, every client computed trains, rows if the model reads them, clients)``.

    No host round-trip in the loop: every shape and flag was planned; a step's key is all it takes from the host. A
    step computes its first ``clients`` (with ``compacts``, those that still train, the stack being longest first;
    a recorded step a few more, so that few shapes serve the round). Recorded steps always take the masked path
    (with every client active its factors are exact ones: the same numbers), so one recording serves the steps
    before and after a client finishes."""
    n = len(plan.steps)
    keys = []
    for w, every, rows in zip(plan.widths, plan.every, plan.rows, strict=True):
        if not w:
            continue
        clients = n
        if compacts:
            training = len(rows) - rows.count(0)
            clients = computed_clients(training, n, recorded)
            every = training == clients
        keys.append((w, every and not recorded, tuple(rows[:clients]) if reads_rows else None, clients))
    return keys


def _handed_out(order: list[int] | None, kept: bool, device: torch.device) -> Callable[[torch.Tensor], torch.Tensor]:
    """What the caller gets of a trained stack's tensor: a kept step's tensors are overwritten by the next call, and
    a reordered stack is put back in the caller's order (copies, both); else the tensor itself."""
    if order is not None:
        back = index_on(sorted(range(len(order)), key=order.__getitem__), device)
        return lambda v: v.index_select(0, back)
    return (lambda v: v.clone()) if kept else (lambda v: v)


def term_of(regulariser: Regulariser | Proximal | None) -> Regulariser | None:
    """A regulariser that is a loss term of its own (a :class:`Proximal` term is added by its gradient)."""
    return None if isinstance(regulariser, Proximal) else regulariser


def _gradients(total: torch.Tensor, leaves: Params, moving: sgd_in_backward.SGDInBackward | None) -> Params:
    """The gradients of ``total`` for the leaves the backward did not move (all of them without ``moving``)."""
    grads = torch.autograd.grad(total, list(leaves.values()), allow_unused=moving is not None)
    if moving is None:
        return dict(zip(leaves, grads, strict=True))
    out = {}
    for k, g in zip(leaves, grads, strict=True):
        held = moving.held.get(k)
        if held is not None:  # a weight used more than once: its uses' gradients
            g = held if g is None else g + held
        if g is None and k not in moving.moved:
            raise RuntimeError(f"the parameter {k!r} was not used in the step's loss")
        if g is not None:
            out[k] = g
    return out


def longest_first(data: ClientData, schedule: LocalSchedule) -> list[int] | None:
    """The stack's positions by planned steps, longest first (ties in order), so that the clients still training
    at any step are the first ones; None when the stack is in that order already."""
    steps = schedule.planned_steps([len(i) for i in data.indices])
    order = sorted(range(len(steps)), key=lambda i: -steps[i])
    return None if order == list(range(len(steps))) else order


def _reordered(order: list[int], params: Params, opt_state: Params | None, regulariser: Regulariser | Proximal | None,
               data: ClientData) -> tuple[Params, Params | None, Regulariser | Proximal | None, ClientData]:
    """A stack's inputs with its clients in ``order`` (a stacked tensor is ``[n, ...]``; a proximal centre may be
    one model for all, one dimension less)."""
    at = index_on(order, data.x.device)
    params = {k: v.detach().index_select(0, at) for k, v in params.items()}
    if opt_state is not None:
        opt_state = {k: v.detach().index_select(0, at) for k, v in opt_state.items()}
    if isinstance(regulariser, Proximal):
        regulariser = regulariser.per_client(lambda v: v.index_select(0, at), params)
    data = dataclasses.replace(
        data, client_ids=[data.client_ids[i] for i in order], indices=[data.indices[i] for i in order],
        seeds=[data.seeds[i] for i in order],
        val_indices=None if data.val_indices is None else [data.val_indices[i] for i in order])
    return params, opt_state, regulariser, data


#: how many recorded steps (with their static tensors) are kept for the calls that follow
KEEP_RECORDED = 8
_RECORDED: OrderedDict[tuple[Any, ...], tuple[_Step, capture.StepGraphs]] = OrderedDict()


def forget_recorded() -> None:
    """Drop every kept recording and the tensors it holds (they are otherwise dropped when a step with other data
    is recorded, e.g. by the next run)."""
    _RECORDED.clear()


def _recorded(step: _Step, keys: list[tuple[int, bool, Any, int]], recorder: type | None = None
              ) -> tuple[_Step, capture.StepGraphs]:
    """``step`` with its recordings: those of an earlier call whose step had the same signature (the next round
    of a run has the same stack shapes), its tensors loaded with this call's values; or new ones, kept.

    Recording a step costs about an eager step plus the graph's instantiation (~3 ms of a ten-step round on an
    H100, ``benchmarks/profile_round.py``): once per run instead of once per round."""
    signature = (recorder, *step.signature())
    kept = _RECORDED.get(signature)
    if kept is not None and kept[0].same_sources(step):
        _RECORDED.move_to_end(signature)
        kept[0].load(step)
        kept[1].plan(keys)
        return kept
    step = step.owning()
    graphs = capture.StepGraphs(step, keys, step.keys.device, recorder=recorder)
    for other in [k for k, (s, _) in _RECORDED.items() if s.data.x is not step.data.x]:
        del _RECORDED[other]  # another run's or phase's data: it is done, and its pool need not stay alive
    _RECORDED[signature] = (step, graphs)
    while len(_RECORDED) > KEEP_RECORDED:
        _RECORDED.popitem(last=False)
    return step, graphs


@dataclass
class _Step:
    """One step of :func:`train_stack`'s stack. Its effects are in place (parameters, optimiser state, loss
    sum; buffers are replaced, which keeps such steps eager), so :mod:`hetfed.engine.capture` can replay it from
    static ``inputs`` (batch index, row mask, active flags) and the step number as a device scalar."""

    model: Model
    data: ClientData
    keys: torch.Tensor  # [n] each client's round key (its dropout streams)
    fixed: Params
    current: Params
    state: Params
    loss_sum: torch.Tensor
    opt_cfg: OptimizerConfig
    lr: float
    objective: Objective | StackObjective | None
    term: Regulariser | None
    proximal: Proximal | None
    project: Projection | InPlace | None
    #: this round's dropout streams (:class:`hetfed.streams.RoundDraws`), for the steps run eagerly
    masks: streams.RoundDraws | None = None
    #: a step of at least this many clients, every one training, moves its linear layers' weights in the backward
    #: (:mod:`hetfed.models.sgd_in_backward`: plain steps under SGD; 0: never)
    moves: int = 0
    #: the model's loss and gradients in closed form for this step (:meth:`hetfed.models.base.Model.closed_form`, a
    #: plain step), else None: autograd's
    closed: closed_form.ClosedForm | None = None
    #: the moves of a closed-form step over the whole stack, kept for its next steps (the same tensors, in place)
    _whole_moves: sgd_in_backward.SGDInBackward | None = field(default=None, init=False, repr=False)

    def _moving(self, leaves: Params, proximal: Proximal | None, state: Params) -> sgd_in_backward.SGDInBackward:
        """What this step's backward may move: its stacked weights, by SGD with the optimiser's weight decay, momentum
        (``state``: this step's buffers) and the proximal term folded in."""
        mu = proximal.weight if proximal is not None else 0.0
        weights = {k: v for k, v in leaves.items() if v.ndim == 3}
        centres = {k: proximal.centre[k] for k in weights if k in proximal.centre} if proximal is not None else {}
        return sgd_in_backward.SGDInBackward(weights, self.lr, self.opt_cfg.weight_decay + mu, centres, mu,
                                             self.opt_cfg.momentum,
                                             optim.momentum_buffers(self.opt_cfg, state, list(weights)),
                                             smallest=closed_form.MOVE_FROM if self.closed is not None else None)

    def _autograd(self, fixed: Params, current: Params, inputs: tuple[torch.Tensor, ...], noise: Noise,
                  moving: Callable[[Params], sgd_in_backward.SGDInBackward | None]
                  ) -> tuple[torch.Tensor, Params, Params, sgd_in_backward.SGDInBackward | None]:
        """The step's loss per client (as reported), gradients, trained leaves and what the backward moved, by
        autograd over the objective (the model's cross-entropy by default) and any loss term."""
        xb, yb, mask = inputs
        leaves = {k: v.detach().requires_grad_(True) for k, v in current.items()}
        spec = moving(leaves)
        objective = self.objective
        if isinstance(objective, StackObjective):  # over its inputs held in ``fixed`` (of the clients computed)
            objective, fixed = objective.on(fixed)
        with sgd_in_backward.updating(spec) if spec is not None else nullcontext():
            out = (objective or partial(cross_entropy, self.model))({**fixed, **leaves}, xb, yb, mask, noise)
        per_client, reported = out if isinstance(out, tuple) else (out, out)
        total = per_client if self.term is None else per_client + self.term({**fixed, **leaves})
        return reported, _gradients(total.sum(), leaves, spec), {k: v.detach() for k, v in leaves.items()}, spec

    def __call__(self, inputs: Sequence[torch.Tensor], t: int | torch.Tensor, key: tuple[int, bool, Any, int],
                 rows: list[int]) -> None:
        index, mask, active = inputs
        every = key[1]
        xb, yb = take_rows(self.data.x, index), take_rows(self.data.y, index)
        # the stack's first ``clients`` compute (the others finished their plans): views, updated in place
        clients = index.shape[0]
        whole = clients == self.keys.shape[0]
        fixed, state, proximal, loss_sum = self.fixed, self.state, self.proximal, self.loss_sum
        current, keys, masks = self.current, self.keys, self.masks
        if not whole:
            fixed, state, current = ({k: v[:clients] for k, v in d.items()} for d in (fixed, state, current))
            loss_sum, keys = loss_sum[:clients], keys[:clients]
            masks = masks.head(clients) if masks is not None else None
            if proximal is not None:
                proximal = proximal.per_client(lambda v: v[:clients], current)
        noise = Noise(keys, t, rows, masks=masks)
        moves = every and 0 < self.moves <= clients

        def moving(leaves: Params) -> sgd_in_backward.SGDInBackward | None:
            if not moves:
                return None
            if whole and self.closed is not None:  # the step's own tensors: the same spec serves every such step
                if self._whole_moves is None:
                    self._whole_moves = self._moving(leaves, proximal, state)
                return self._whole_moves.again()
            return self._moving(leaves, proximal, state)

        if self.closed is None:
            reported, grads, current, spec = self._autograd(fixed, current, (xb, yb, mask), noise, moving)
        with torch.no_grad():
            if self.closed is not None:
                spec = moving(current)
                reported, grads = self.closed({**fixed, **current} if fixed else current, xb, yb, mask, noise, spec)
            if proximal is not None:
                grads = proximal.add_gradient(grads, current)
            optim.step(self.opt_cfg, {k: current[k] for k in grads} if spec is not None else current, grads, state,
                       self.lr, active, every=every)
            if isinstance(self.project, InPlace):  # the step's tensors (the clients computed: views) in place
                self.project.apply(current)
            elif self.project is not None:  # else ``current`` is this step's tensors, updated in place
                self.current = self.project(current)
            for k, values in noise.updates.items():  # buffers: the stack's new values (batch norm's statistics)
                if k in fixed:
                    fixed[k] = values.to(fixed[k].dtype)
            loss_sum.add_(reported.detach() if every else reported.detach() * active)

    # -- kept across calls (recorded steps): what the recorded kernels read lives in this step's tensors
    def signature(self) -> tuple[Any, ...]:
        """What a recording of this step was made for, besides the tensors' values."""
        shapes = [tuple((k, tuple(v.shape), v.dtype) for k, v in d.items())
                  for d in (self.current, self.state, self.fixed, self.proximal.tensors() if self.proximal else {})]
        loss = self.objective.loss if isinstance(self.objective, StackObjective) else None
        return (id(self.model), id(self.data.x), id(self.data.y), len(self.keys), self.lr,
                self.opt_cfg.model_dump_json(), self.proximal.weight if self.proximal else None, loss, *shapes)

    def same_sources(self, other: _Step) -> bool:
        """The same model and data tensors (held here, so an id in the signature cannot be reused meanwhile)."""
        return self.model is other.model and self.data.x is other.data.x and self.data.y is other.data.y

    def owning(self) -> _Step:
        """This step with its own copies of the caller's tensors that later calls will overwrite."""
        centre = Proximal({k: v.clone() for k, v in self.proximal.centre.items()}, self.proximal.weight,
                          {k: v.clone() for k, v in self.proximal.shift.items()}) if self.proximal else None
        keys = self.keys.clone()
        return dataclasses.replace(self, keys=keys, fixed={k: v.clone() for k, v in self.fixed.items()},
                                   proximal=centre, masks=self._draws_of(keys, self.masks))

    @staticmethod
    def _draws_of(keys: torch.Tensor, like: streams.RoundDraws | None) -> streams.RoundDraws | None:
        """``like``'s dropout streams hashed from ``keys``: a recorded step hashes its draws from the key tensor it
        read when it was recorded, so that must be the step's own (loaded in place each call), never a call's."""
        return None if like is None else streams.RoundDraws(keys, like.steps, like.purpose, like.draws)

    def load(self, other: _Step) -> None:
        """Another call's values into this step's tensors (same signature)."""
        for mine, theirs in ((self.current, other.current), (self.state, other.state), (self.fixed, other.fixed),
                             (self.proximal.tensors() if self.proximal else {},
                              other.proximal.tensors() if other.proximal else {})):
            for k, v in mine.items():
                v.copy_(theirs[k])
        self.keys.copy_(other.keys)
        # this call's round: a step run eagerly reads its table, hashed anew from the keys just loaded
        self.masks = self._draws_of(self.keys, other.masks)
        self.loss_sum.zero_()
