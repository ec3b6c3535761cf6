"""FedDF (Lin, Kong, Stich, Jaggi 2020, "Ensemble distillation for robust model fusion in federated learning").

Clients train as in FedAvg and upload their models. The server then:

1. averages them (FedAvg's weighted mean — or the configured robust/private rule),
   the student's starting point;
2. distils the *ensemble* of the received client models into it on unlabeled
   server data (``server_data.*``): the teacher is the mean of the clients' logits,
   the loss ``T² · KL(softmax(teacher/T) ‖ softmax(student/T))``, Adam
   (``feddf.lr`` 1e-3, batches of ``feddf.batch_size`` 128, temperature 1 — the
   paper's settings), at most ``feddf.max_steps`` steps with early stopping after
   ``feddf.patience`` steps without improvement (defaults 500 and 200, so a CPU round
   takes seconds; the paper's 10⁴ and 10³ are a setting away);
3. broadcasts the distilled model.

Where we choose differently from the paper (options): early stopping is judged by
the KL to the ensemble on a held-out share of the *unlabeled* server data
(``feddf.val_fraction``), since hetfed's server has no labels; the paper validated
on labeled data. The best student by that KL is kept. Clients' local parameters
(CGAU rows) are not sent, so an ensemble member predicts as for an unseen client.
Every update of the round is needed at once (the ensemble), so they are held, not
streamed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from pydantic import Field

from hetfed.algorithms.fedavg import FedAvg
from hetfed.algorithms.registry import (
    AlgorithmParams,
    AlgorithmSpec,
    Capabilities,
    PrivacyRow,
    register,
)
from hetfed.engine.rng import derive_seed
from hetfed.engine.types import Params, ServerState, Upload
from hetfed.errors import ConfigError
from hetfed.interface import chain_aggregates
from hetfed.models.base import Model

DISTILL = 41  # rng purpose: the server's distillation batches


class FedDFParams(AlgorithmParams):
    """FedDF's server-side ensemble distillation (Lin et al. 2020: Adam 1e-3, batch 128, T = 1, early
    stopping; their step budget of 10⁴ with patience 10³ is ``max_steps: 10000, patience: 1000``)."""

    lr: float = Field(1e-3, gt=0, description="Adam learning rate")
    batch_size: int = Field(128, ge=1)
    temperature: float = Field(1.0, gt=0)
    max_steps: int = Field(500, ge=1, description="distillation steps per round at most (the paper: 10 000; "
                           "500 keeps a CPU round in seconds)")
    patience: int = Field(200, ge=1, description="stop after this many steps without a better validation KL "
                          "(the paper: 1 000)")
    eval_every: int = Field(50, ge=1, description="steps between validation checks")
    val_fraction: float = Field(0.2, ge=0, lt=1, description="share of the server data held out for early stopping "
                                "(0: no early stopping, the last student is kept)")


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``T² · KL(softmax(teacher/T) ‖ softmax(student/T))``, averaged over samples: of logits ``[B, C]`` a number,
    of a stack's ``[R, B, C]`` one per row (each row's sum over its own samples, whatever the stack)."""
    t = temperature
    kl = F.kl_div(F.log_softmax(student_logits / t, -1), F.log_softmax(teacher_logits / t, -1), log_target=True,
                  reduction="none")
    return kl.sum((-2, -1)) / student_logits.shape[-2] * t * t


class FedDF(FedAvg):
    """FedAvg + server-side ensemble distillation on unlabeled data (see the module docstring)."""

    def __init__(self, model: Model, train, params: FedDFParams | None = None, context=None):
        super().__init__(model, train, params, context)
        self.cfg = self.params
        self.server_x: torch.Tensor | None = None

    def bind(self, fed, seed: int = 0, per_round: int = 1) -> None:
        super().bind(fed, seed, per_round)
        if getattr(fed, "server_x", None) is None:
            raise ConfigError("algorithm 'feddf' needs unlabeled server data but this federation has none: expected "
                              "server_data.source 'auto', 'holdout' or 'dataset'")
        self.server_x = torch.as_tensor(fed.server_x, dtype=torch.float32)

    def aggregate(self, state: ServerState, upload: Upload) -> ServerState:
        return self.aggregate_runs([self], [state], [upload])[0]

    def aggregate_key(self, state: ServerState, upload: Upload) -> tuple:
        """Runs (of the same parameters and model) distil their students in one stack when they hold them on one
        device and their server data have one shape (a sweep's seeds), their server chains one computation."""
        return (self.context.pipeline.identity, str(next(iter(state.params.values())).device),
                tuple(self._server_x().shape))

    @classmethod
    def aggregate_runs(cls, algos: Sequence[FedDF], states: Sequence[ServerState],
                       uploads: Sequence[Upload]) -> list[ServerState]:
        """The runs' FedAvg steps (their server chains in one call), then every run's student distilled from its
        own ensemble in one stack (:func:`distil_runs`): each run's numbers as alone."""
        averaged = chain_aggregates(algos, states, uploads)
        distilled = distil_runs(algos, [a.params for a in averaged], uploads, [s.round for s in states])
        return [ServerState(params, a.round, {**a.extra, "distill_steps": steps})
                for a, (params, steps) in zip(averaged, distilled, strict=True)]

    def _server_x(self) -> torch.Tensor:
        if self.server_x is None:
            raise RuntimeError("FedDF distils on the server's data: bind() the federation first")
        return self.server_x

    def _logits(self, params: Params, x: torch.Tensor, own: bool = False) -> torch.Tensor:
        """Logits of stacked models ``[n, …]`` on ``x`` — one set of samples for every model, or (``own``) each
        model's own, ``x[i]`` model i's: ``[n, len, C]`` (local parameters as for an unseen client)."""
        n = next(iter(params.values())).shape[0]
        unseen = {k: v.to(x.device).unsqueeze(0).expand(n, *v.shape)
                  for k, v in self.model.local_for_unseen_client().items()}
        return self.model.forward({**params, **unseen}, x if own else x.unsqueeze(0).expand(n, *x.shape), None)

    def teacher(self, x: torch.Tensor, upload: Upload, names: list[str]) -> torch.Tensor:
        """The ensemble's logits on ``x``: the mean of ``upload``'s client models' (in blocks of 1 024 samples)."""
        with torch.no_grad():
            return torch.cat([self._logits({k: upload.params[k].to(x.device) for k in names}, x[i:i + 1024]).mean(0)
                              for i in range(0, len(x), 1024)])


@dataclass
class _Student:
    """One run's student while it is distilled (:func:`distil_runs`): its leaves, its data and its early stopping."""

    leaves: Params
    x: torch.Tensor
    teacher: torch.Tensor
    val: torch.Tensor
    fit: torch.Tensor
    batches: Iterator[torch.Tensor]
    best: Params
    best_val: float = float("inf")
    since: int = 0
    steps: int = 0
    stopped: bool = False


def distil_runs(algos: Sequence[FedDF], starts: Sequence[Params], uploads: Sequence[Upload],
                rounds: Sequence[int]) -> list[tuple[Params, int]]:
    """Each run's student (from its ``starts``) distilled from the ensemble of its ``uploads``' client models; the
    steps each ran. The runs' students step together — one forward and backward for all that have not stopped —
    while each keeps its own batches, validation and early stopping, and its own Adam state (one leaf per run and
    tensor: a run that stopped gets no gradient, which Adam skips), so a run's numbers do not depend on the others
    (the paper's per-round distillation, run by run, in one stack)."""
    cfg = algos[0].cfg
    device = next(iter(starts[0].values())).device
    names = list(starts[0])
    runs = []
    for a, start, upload, rnd in zip(algos, starts, uploads, rounds, strict=True):
        x = a._server_x().to(device)
        gen = torch.Generator().manual_seed(derive_seed(a._seed, DISTILL, rnd))
        order = torch.randperm(len(x), generator=gen)
        n_val = int(round(cfg.val_fraction * len(x)))
        leaves = {k: v.detach().clone().unsqueeze(0).requires_grad_(True) for k, v in start.items()}
        runs.append(_Student(leaves, x, a.teacher(x, upload, names), order[:n_val].to(device),
                             order[n_val:].to(device), _batches(len(x) - n_val, cfg.batch_size, gen),
                             {k: v.detach().clone() for k, v in leaves.items()}))
    # foreach: one call for every leaf of every run (on a CPU the same numbers as a loop over them, measured; torch's
    # default loops there, and 20 runs' leaves were a Python loop of ~100 tensors a step)
    opt = torch.optim.Adam([v for r in runs for v in r.leaves.values()], lr=cfg.lr, foreach=True)
    validating = bool(len(runs[0].val))
    if validating:
        for r, loss in zip(runs, _losses(algos[0], runs, "val").tolist(), strict=True):
            r.best_val = loss
    for step in range(1, cfg.max_steps + 1):
        active = [r for r in runs if not r.stopped]
        if not active:
            break
        picks = [r.fit[next(r.batches).to(device)] for r in active]
        opt.zero_grad()
        _losses(algos[0], active, picks).sum().backward()
        opt.step()
        for r in active:
            r.steps = step
        if validating and step % cfg.eval_every == 0:
            now = _losses(algos[0], active, "val").tolist()
            for r, v in zip(active, now, strict=True):
                if v < r.best_val:
                    r.best_val, r.since, r.best = v, 0, {k: t.detach().clone() for k, t in r.leaves.items()}
                else:
                    r.since += cfg.eval_every
                    r.stopped = r.since >= cfg.patience
    return [({k: v.detach()[0] for k, v in (r.best if validating else r.leaves).items()}, r.steps) for r in runs]


def _losses(algo: FedDF, runs: list[_Student], picks: list[torch.Tensor] | str) -> torch.Tensor:
    """Each run's distillation loss on its samples ``picks`` (``"val"``: its validation samples), ``[runs]``: the
    runs' forwards and losses computed as one stack."""
    rows = [r.val for r in runs] if isinstance(picks, str) else picks
    names = list(runs[0].leaves)
    leaves = runs[0].leaves if len(runs) == 1 else {k: torch.cat([r.leaves[k] for r in runs]) for k in names}
    with torch.no_grad() if isinstance(picks, str) else nullcontext():
        logits = algo._logits(leaves, torch.stack([r.x[i] for r, i in zip(runs, rows, strict=True)]), own=True)
    return distillation_loss(logits, torch.stack([r.teacher[i] for r, i in zip(runs, rows, strict=True)]),
                             algo.cfg.temperature)


def _batches(n: int, size: int, gen: torch.Generator):
    """Batches of ``size`` indices in ``range(n)``: passes over a fresh random order each (a full batch when size ≥
    n)."""
    size = min(size, n)
    while True:
        order = torch.randperm(n, generator=gen)
        for start in range(0, n - size + 1, size):
            yield order[start : start + size]


register(AlgorithmSpec(
    "feddf", FedDF, "FedAvg, then the server distils the clients' ensemble into the global model on unlabeled data",
    "Lin et al. 2020, Ensemble Distillation for Robust Model Fusion in Federated Learning", FedDFParams,
    Capabilities(server_data=True, whole_round=True, stacks_runs=True), legacy_section="feddf",
    quick={"max_steps": 10, "eval_every": 5},
    privacy=(
        PrivacyRow(
            method="FedDF",
            config="`algorithm: feddf`",
            params="shared model parameters (every client of the round, held together: the server ensembles them)",
            extra="`train_loss`",
            stays="data; optimiser state when kept",
        ),
    ),
    family="heterogeneity-specific", venue="NeurIPS 2020",
))
