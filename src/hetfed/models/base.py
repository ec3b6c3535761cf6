"""What every model declares: its parameters (shared or local) and a stacked forward.

Models are written over a leading *client axis*: parameters have shape
``[n_clients, ...]`` and inputs ``[n_clients, batch, features]``. One client is
just ``n_clients = 1``, so the sequential and the vectorised executor run the
very same code — they differ only in how many clients they stack. Dense layers
use batched matmuls (``baddbmm``) over the client axis; layers without a cheap
batched form (convolutions) are vectorised with ``torch.func.vmap``.

*Shared* parameters are broadcast by the server and aggregated; *local* ones are
created on a client (``init_local``) and never leave it. The split is declared
here, once, by the model — algorithms, executors and the privacy tests read it
from :attr:`Model.local_names` instead of special-casing methods.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from hetfed import streams
from hetfed.models import sgd_in_backward
from hetfed.models.closed_form import ClosedForm

Params = dict[str, torch.Tensor]
V = TypeVar("V")


def prefixed(values: Mapping[str, V], prefix: str) -> dict[str, V]:
    """``values`` with ``prefix`` before each key: one named part of a flat dict of tensors (a client's personal
    model beside its local state, an objective's inputs among a step's fixed tensors, a broadcast's per-client rows).
    :func:`under` reads the part back."""
    return {prefix + k: v for k, v in values.items()}


def under(values: Mapping[str, V], prefix: str) -> dict[str, V]:
    """The part of ``values`` whose keys start with ``prefix``, keyed by the rest of each key (:func:`prefixed`'s
    inverse), in ``values``' order."""
    return {k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix)}


def without(values: Mapping[str, V], *prefixes: str) -> dict[str, V]:
    """``values`` less its entries whose keys start with any of ``prefixes`` (a state less its named parts)."""
    return {k: v for k, v in values.items() if not k.startswith(prefixes)}


Init = Callable[[torch.Generator, tuple[int, ...]], torch.Tensor]


def uniform_init(bound: float) -> Init:
    """U(−bound, bound), drawn from an explicit generator (deterministic by seed)."""

    def init(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
        return (torch.rand(shape, generator=gen) * 2 - 1) * bound

    return init


def fan_in_init(fan_in: int) -> Init:
    """PyTorch's default for Linear/Conv weights and biases: U(±1/√fan_in)."""
    return uniform_init(1.0 / math.sqrt(max(fan_in, 1)))


def zeros_init(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.zeros(shape)


def ones_init(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    return torch.ones(shape)


@dataclass(frozen=True)
class ParamSpec:
    """One parameter tensor of one client: its name, shape, initialiser and owner."""

    name: str
    shape: tuple[int, ...]
    init: Init
    local: bool = False
    #: not trained by gradient: state the forward updates while training (batch norm's running statistics)
    buffer: bool = False


def linear_init(gen: torch.Generator, n_in: int, n_out: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.nn.Linear``'s default initialisation (weight ``[n_out, n_in]`` and bias uniform in ±1/√n_in), drawn
    from ``gen``: the auxiliary networks some methods add (hypernetworks, GPFL's valve, FedCP's policy) start as
    their authors' ``nn.Linear`` layers do."""
    import math

    bound = 1 / math.sqrt(n_in)
    return (torch.empty(n_out, n_in).uniform_(-bound, bound, generator=gen),
            torch.empty(n_out).uniform_(-bound, bound, generator=gen))


class Noise:
    """The random draws of one training step for a stack of clients (dropout masks), made on the device.

    A mask entry is a pure function of (client key, step, draw, row, column) — :mod:`hetfed.streams` —
    computed for the whole stack in tensor operations: it does not depend on which clients share the stack
    or on its padded batch, so a client draws what it draws in a one-client run, on any device. ``rows``
    (host ints: each client's real rows this step) serve the models that read them (batch norm's statistics).
    """

    def __init__(self, keys: torch.Tensor, step: int | torch.Tensor, rows: Sequence[int], row_offset: int = 0,
                 counter: list[int] | None = None, masks: streams.RoundDraws | None = None):
        self.keys = keys  # [n] int64 on the device: each client's round key
        self.step = step  # an int, or a 0-d int64 device tensor in a recorded step (the same bits)
        #: the round's dropout streams (hashed for every step at once; without a round's table, each draw's hashed
        #: when made)
        self.masks = masks if masks is not None else streams.RoundDraws(keys, 0, streams.DROPOUT_MASK)
        self.rows = rows  # real (unpadded) batch rows per client
        self.row_offset = row_offset
        self._counter = counter if counter is not None else [0]  # draws so far this step (shared by columns)
        #: buffer name → the stack's new values the forward computed in this step (batch norm's statistics;
        #: clients without rows this step keep their old values)
        self.updates: MutableMapping[str, torch.Tensor] = {}

    @property
    def device(self) -> torch.device:
        return self.keys.device

    def columns(self, start: int, width: int) -> Noise:
        """The same streams for the batch columns ``start … start + width`` (a step that splits its batch into
        several, as Per-FedAvg's D, D', D''): each client's real rows there, their own row positions."""
        rows = [max(0, min(r - start, width)) for r in self.rows]
        part = Noise(self.keys, self.step, rows, self.row_offset + start, self._counter, self.masks)
        part.updates = self.updates
        return part

    def under(self, prefix: str) -> Noise:
        """The same streams (its draws continue this step's) for a method's copy of the model whose entries carry
        ``prefix`` (APFL's local model ``apfl.v.``, a FedEM component ``fedem.<m>.``): the statistics its forward
        computes go into ``updates`` under that prefix, so each copy's batch norm moves its own running
        statistics instead of overwriting the model's."""
        part = Noise(self.keys, self.step, self.rows, self.row_offset, self._counter, self.masks)
        part.updates = _Prefixed(self.updates, prefix)
        return part

    def keep_mask(self, batch: int, width: int, p: float) -> torch.Tensor:
        """Inverted-dropout multipliers ``[n, batch, width]`` (0 or 1/(1−p)) for this step's next draw."""
        draw = self._counter[0]
        self._counter[0] += 1
        state = self.masks.state(self.step, draw)  # [n]
        cell = torch.arange(self.row_offset * width, (self.row_offset + batch) * width, device=self.device)
        drawn = streams.next32(state[:, None], cell[None]).view(-1, batch, width)  # row-major (row, column)
        return streams.at_least(drawn, streams.below(p)).to(torch.float32).mul_(1.0 / (1 - p))


    def uniforms(self, batch: int, width: int) -> torch.Tensor:
        """U[0, 1) draws ``[n, batch, width]`` for this step's next draw (a model's own noise: FedCP's Gumbel
        selection), from the same per-client stream as the dropout masks: the same for a client whatever its
        stack, on every device."""
        draw = self._counter[0]
        self._counter[0] += 1
        prefix = streams.bits(self.keys, streams.MODEL_DRAW, self.step, draw)  # [n]
        cell = torch.arange(self.row_offset * width, (self.row_offset + batch) * width, device=self.device)
        return streams.uniform(prefix[:, None], cell[None]).view(-1, batch, width)


class _Prefixed(MutableMapping[str, torch.Tensor]):
    """``target`` seen through a prefix: what is set as ``k`` lands in ``target`` as ``prefix + k``
    (:meth:`Noise.under`)."""

    def __init__(self, target: MutableMapping[str, torch.Tensor], prefix: str):
        self.target, self.prefix = target, prefix

    def __getitem__(self, k: str) -> torch.Tensor:
        return self.target[self.prefix + k]

    def __setitem__(self, k: str, value: torch.Tensor) -> None:
        self.target[self.prefix + k] = value

    def __delitem__(self, k: str) -> None:
        del self.target[self.prefix + k]

    def __iter__(self) -> Iterator[str]:
        return (k[len(self.prefix):] for k in list(self.target) if k.startswith(self.prefix))

    def __len__(self) -> int:
        return sum(1 for _ in self)


def dropout(h: torch.Tensor, p: float, noise: Noise | None) -> torch.Tensor:
    """Dropout over a stack; identity at evaluation (``noise is None``) or p = 0."""
    if noise is None or p <= 0:
        return h
    return h * noise.keep_mask(h.shape[1], h.shape[2], p)


def dense(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``x @ W + b`` for every client at once: x [n,b,i], W [n,i,o], b [n,o] (its weight moved by SGD in the backward
    when the step asks: :mod:`hetfed.models.sgd_in_backward`)."""
    return sgd_in_backward.linear(x, weight, bias)


class Model:
    """Base class: subclasses list their :class:`ParamSpec` and implement ``forward``."""

    n_classes: int
    #: the forward reads each client's real rows of the step on the host (``Noise.rows``): a step recorded for
    #: replay (:mod:`hetfed.engine.capture`) is then recorded per pattern of rows, not only per batch width
    reads_rows: bool = False
    #: why DP-SGD's per-sample gradients (``torch.func.vmap`` of the gradient through :meth:`forward`) are not
    #: available for this model, or "" where they are
    no_per_sample_gradients: str = ""
    #: why ``torch.compile`` cannot trace this model's training step (``train.capture: compile``), or "" where it can
    no_compile: str = ""

    @property
    def compile_gains(self) -> bool:
        """Whether a compiled training step is faster than the eager one on a CPU: ``train.capture: auto`` compiles a
        long CPU run's steps (:data:`hetfed.engine.capture.COMPILE_PAYS_AFTER_ROUNDS`) only where it is. True unless
        a model measured otherwise."""
        return True

    def stacks_clients(self, device: str) -> bool:
        """Whether a stack of clients runs as one batched computation on ``device`` (a device type: 'cpu',
        'cuda'). False where the forward loops over the stack's clients: a stack of several then costs what they
        cost one by one plus its padding and stacking, so the in-process executors train them one at a time."""
        return True

    def specs(self) -> list[ParamSpec]:
        raise NotImplementedError

    def closed_form(self, names: set[str]) -> ClosedForm | None:
        """A plain training step's loss and gradients without autograd (:mod:`hetfed.models.closed_form`: a step of a
        small stack is bound by autograd's fixed cost) when the step trains the parameters named ``names`` (the others
        it is handed are held fixed); None where the model writes none out (autograd computes them)."""
        return None

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        """Logits ``[n, batch, n_classes]`` for stacked params and inputs."""
        raise NotImplementedError

    #: the classifier head (the last layer) as parameter names, when the model declares the split
    #: ``forward = head(features(x))`` (FedGen regularises the head on generated features); None: no split
    @property
    def head_names(self) -> tuple[str, ...] | None:
        return None

    @property
    def latent_dim(self) -> int:
        """The width of ``features``' output, the head's input."""
        return 0

    def features(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        """Latent features ``[n, batch, latent_dim]`` (everything before the head)."""
        raise NotImplementedError(f"{type(self).__name__} declares no feature extractor / head split")

    def head(self, params: Params, z: torch.Tensor) -> torch.Tensor:
        """Logits ``[n, batch, n_classes]`` of the head on latent features ``z``."""
        raise NotImplementedError(f"{type(self).__name__} declares no feature extractor / head split")

    @property
    def shared_names(self) -> list[str]:
        return [s.name for s in self.specs() if not s.local]

    @property
    def local_names(self) -> list[str]:
        return [s.name for s in self.specs() if s.local]

    @property
    def buffer_names(self) -> list[str]:
        """Parameters no gradient moves: the forward updates them while training (via ``Noise.updates``)."""
        return [s.name for s in self.specs() if s.buffer]

    def _init(self, gen: torch.Generator, local: bool) -> Params:
        return {s.name: s.init(gen, s.shape).float() for s in self.specs() if s.local == local}

    def init_shared(self, gen: torch.Generator) -> Params:
        """Server-side parameters (unstacked), drawn from the run's generator."""
        return self._init(gen, local=False)

    def init_local(self, gen: torch.Generator) -> Params:
        """A client's own parameters (unstacked); empty for plain models."""
        return self._init(gen, local=True)

    def local_for_unseen_client(self, device: torch.device | str | None = None) -> Params:
        """Local params for a client never seen in training (default: zeros), made on ``device`` (a copy to a GPU
        would wait for it at every evaluation of the server's model)."""
        return {s.name: torch.zeros(s.shape, device=device) for s in self.specs() if s.local}

    def n_params(self) -> int:
        return sum(math.prod(s.shape) for s in self.specs())

    def activation_floats(self, batch: int) -> int:
        """Rough activations per client per step (for the memory budget)."""
        return batch * 4 * sum(math.prod(s.shape) ** 0.5 for s in self.specs())


class Derived(Model):
    """A model computed from another's parameters (a method's way to predict: FedRoD's two heads, kNN-Per's
    neighbours): the base's parameters plus ``extra`` ones, its classes, its reading of rows."""

    def __init__(self, base: Model, extra: Sequence[ParamSpec] = ()):
        self.base, self.n_classes = base, base.n_classes
        self._specs = [*base.specs(), *extra]

    def specs(self) -> list[ParamSpec]:
        return self._specs

    @property
    def reads_rows(self) -> bool:  # type: ignore[override]
        return self.base.reads_rows

    def stacks_clients(self, device: str) -> bool:
        return self.base.stacks_clients(device)


class Representation(Derived):
    """The base's representation (``features``, before its head) as the output: ``[n, batch, latent_dim]``, for
    what methods compute from it with the evaluation's batched ``predict`` (prototypes, datastores)."""

    def __init__(self, base: Model):
        super().__init__(base)
        self.n_classes = base.latent_dim

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        return self.base.features(params, x, noise)
