"""Clients that fail, straggle or attack — simulated, every choice drawn from the run seed.

- **dropout** (``train.client_dropout``): a sampled client fails to report with
  probability p, drawn per (round, client) — the same whichever executor runs it;
- **stragglers** (``train.stragglers``, or ``train.clock`` in seconds: :mod:`hetfed.engine.clock`): each client
  has a fixed speed drawn from the run seed; a client whose round would pass the ``deadline`` is dropped (late),
  as a synchronous server with a round timeout does;
- **attackers** (``attack.*``, :class:`Adversary`): a fixed share of the opted-in
  clients poisons what it uploads (sign flip, scaling, Gaussian noise), the
  samples it trains on (label flipping, a backdoor's trigger), or colludes: sends one update crafted
  from the round's honest ones (ALIE, IPM, Min-Max, Min-Sum: :class:`Colluding`).

Dropped and late clients do not train in the round (their local state stays as it
was), so a dropout is a failure before the client could report anything.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import numpy as np
import torch

from hetfed.config import AttackConfig, TrainConfig
from hetfed.engine.attacks import ATTACKS, Honest, Samples
from hetfed.engine.backdoor import BackdoorTest
from hetfed.engine.clock import Clock
from hetfed.engine.local import LocalSchedule
from hetfed.engine.rng import ATTACKERS, DROPOUT, numpy_rng, torch_gen
from hetfed.engine.types import Broadcast, Params, RoundUploads, Upload, concat_uploads

if TYPE_CHECKING:
    from hetfed.partition import Federation


@dataclass(frozen=True)
class RoundFaults:
    """Who of a round's sampled clients trains, and who failed or was too slow."""

    training: list[int]
    dropped: list[int]
    late: list[int]


class Faults:
    """Dropouts and stragglers of a run (see the module docstring)."""

    def __init__(self, train: TrainConfig, fed: Federation, seed: int, schedule: LocalSchedule):
        self.p, self.seed, self.n_clients = train.client_dropout, seed, fed.n_clients
        self.clock = Clock.of(train, fed, seed, schedule)

    def round(self, clients: list[int], rnd: int, down_bytes: float = 0.0, up_bytes: float = 0.0) -> RoundFaults:
        """Who of ``clients`` fails (dropout) and who would pass the clock's deadline receiving ``down_bytes`` and
        sending ``up_bytes``."""
        dropped: list[int] = []
        if self.p > 0:
            u = numpy_rng(self.seed, DROPOUT, rnd).random(self.n_clients)
            dropped = [k for k in clients if u[k] < self.p]
        gone = set(dropped)
        late = self.clock.late([k for k in clients if k not in gone], down_bytes, up_bytes)
        out = gone | set(late)
        return RoundFaults([k for k in clients if k not in out], dropped, late)


def malicious_clients(cfg: AttackConfig, opted_out: np.ndarray, seed: int) -> np.ndarray:
    """A boolean mask: ``round(fraction × opted-in clients)`` of them, fixed for the run."""
    mask = np.zeros(len(opted_out), dtype=bool)
    if not ATTACKS.get(cfg.kind).acts:
        return mask
    eligible = np.flatnonzero(~np.asarray(opted_out, dtype=bool))
    m = int(round(cfg.fraction * len(eligible)))
    if m:
        mask[numpy_rng(seed, ATTACKERS).choice(eligible, size=m, replace=False)] = True
    return mask


def sample_shape(fed: Federation) -> tuple[int, ...]:
    """The shape of one of the pool's samples as an attack reads it: the model's input shape (an image's H×W or
    H×W×C) when the rows are that shape flattened, else a row's own (d,)."""
    d = int(np.prod(np.asarray(fed.x).shape[1:]))
    return tuple(fed.input_shape) if int(np.prod(fed.input_shape or (0,))) == d else (d,)


class Adversary:
    """The malicious clients of a run and what they do to their uploads or labels."""

    def __init__(self, cfg: AttackConfig, fed: Federation, seed: int, n_classes: int):
        self.cfg, self.seed, self.n_classes = cfg, seed, n_classes
        self.attack = ATTACKS.get(cfg.kind)
        self.malicious = malicious_clients(cfg, fed.opted_out, seed)
        pool = np.asarray(fed.x)
        #: what a data-poisoning attack reads of the pool: the shape of a sample, and the largest feature value
        self.input_shape = sample_shape(fed)
        self.x_max = float(pool.max()) if pool.size and np.issubdtype(pool.dtype, np.number) else 0.0

    @property
    def active(self) -> bool:
        return self.attack.acts and bool(self.malicious.any())

    def acts_in(self, rnd: int) -> bool:
        """Whether the malicious clients attack in round ``rnd`` (0-based; ``attack.start_round`` … ``stop_round``);
        outside it they train and send as honest clients do."""
        return self.active and self.cfg.attacks_in(rnd)

    def receiving(self, round_uploads: RoundUploads, bc: Broadcast) -> RoundUploads | Colluding:
        """Where a round's uploads go: as they are, or through the colluding clients first (a colluding attack)."""
        return Colluding(round_uploads, self, bc.params, bc.round) if self.attack.collude is not None else round_uploads

    def samples(self, client: int = -1) -> Samples:
        """What a data-poisoning attack reads of the pool (its own generator: ``client``'s, from the run seed; its
        place among the malicious clients)."""
        rank = int(self.malicious[:client].sum()) if client >= 0 else 0
        return Samples(self.input_shape, self.n_classes, self.x_max, numpy_rng(self.seed, ATTACKERS, 1, client + 1),
                       rank)

    def training_data(self, x: torch.Tensor, y: torch.Tensor, train_indices: Sequence[np.ndarray]
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """The pool as the clients train on it: each malicious client's training samples as its attack's
        ``poison_data`` makes them (label flipping, a backdoor's trigger); the others' as they are. The pool's
        tensors themselves where the attack leaves them (a copy otherwise: evaluation reads the clean pool; the
        features are copied only when some client's change)."""
        poison = self.attack.poison_data
        if poison is None:
            return x, y
        out_x, out_y = x, y.clone()
        for k in np.flatnonzero(self.malicious):
            idx = torch.as_tensor(train_indices[int(k)], dtype=torch.long, device=y.device)
            own = x[idx]
            new_x, out_y[idx] = poison(own, y[idx], self.samples(int(k)), self.cfg.params)
            if out_x is x and not torch.equal(new_x, own):
                out_x = x.clone()
            if out_x is not x:
                out_x[idx] = new_x
        return out_x, out_y

    def backdoor_test(self, x: torch.Tensor, y: torch.Tensor, opted_out: np.ndarray) -> BackdoorTest | None:
        """The global test set ``x``, ``y`` as a backdoor's success is measured on it, and the honest opted-in
        clients whose own models are scored on it (None: the attack plants none, or no client is malicious)."""
        made = self.attack.backdoor_test
        if made is None or not self.active:
            return None
        honest = np.flatnonzero(~self.malicious & ~np.asarray(opted_out, dtype=bool)).tolist()
        return BackdoorTest(*made(x, y, self.samples(), self.cfg.params), honest)

    def poison(self, upload: Upload, bc: Broadcast) -> Upload:
        """Model poisoning: malicious clients replace their update Δ (shared parameters only)."""
        poison = self.attack.poison
        if poison is None:
            return upload
        rows = [j for j, k in enumerate(upload.client_ids) if self.malicious[k]]
        if not rows:
            return upload
        params = {k: v.clone() for k, v in upload.params.items()}
        for name, ref in bc.params.items():
            ref = ref.to(params[name].device)
            for j in rows:
                gen = partial(_client_noise, torch_gen(self.seed, ATTACKERS, bc.round, upload.client_ids[j],
                                                       _name_seed(name)))
                params[name][j] = ref + poison(params[name][j] - ref, self.cfg.params, gen)
        return Upload(upload.client_ids, params, upload.num_samples, upload.extra, dict(upload.screened))


class Colluding:
    """A round's uploads as a colluding attack meets them, before the server's screen: the honest clients' rows go on
    to the round at once, the malicious clients' rows wait; when the round ends they carry the update the attack
    crafts (the same for each, or each its own), and go on too. What it crafts from is its ``knowledge``: the honest
    updates (``full``: their running mean and spread kept as they pass, so the round still streams) or the malicious
    clients' own, as they trained them (``partial``). With no update known the crafted update is made from zeros.
    An attack that reads every known update (``reads_rows``) has them held too, as a robust rule holds a round."""

    def __init__(self, round_uploads: RoundUploads, adversary: Adversary, reference: Params, rnd: int = 0) -> None:
        self.inner, self.adversary, self.reference, self.round = round_uploads, adversary, reference, rnd
        self.held: list[Upload] = []
        #: whether the attack knows only its own clients' updates (``knowledge: partial``), not the honest ones
        self.partial = adversary.cfg.params.knowledge == "partial"
        self.passed = 0  # honest uploads gone on to the round
        self.count = 0  # updates known (observed)
        self.mean: dict[str, torch.Tensor] = {}  # float64, per shared parameter
        self.m2: dict[str, torch.Tensor] = {}  # Σ (Δ − mean)²
        self.rows: dict[str, list[torch.Tensor]] | None = {k: [] for k in reference} \
            if adversary.attack.reads_rows else None

    def add(self, upload: Upload, measured: object = None) -> None:
        malicious = [bool(self.adversary.malicious[k]) for k in upload.client_ids]
        bad = [j for j, is_bad in enumerate(malicious) if is_bad]
        if bad:
            self.held.append(upload.take(bad))
            measured = None
        honest = [j for j, is_bad in enumerate(malicious) if not is_bad]
        if honest:
            part = upload.take(honest) if bad else upload
            self.passed += len(honest)
            if not self.partial:
                self._observe(part)
            self.inner.add(part, measured)

    def _observe(self, upload: Upload) -> None:
        """Chan et al.'s pairwise update of the known updates' mean and sum of squared deviations (float64)."""
        b = len(upload.client_ids)
        total = self.count + b
        for name, ref in self.reference.items():
            delta = upload.params[name].double() - ref.to(upload.params[name].device).double()
            if self.rows is not None:
                self.rows[name].append(delta)
            mean_b = delta.mean(0)
            m2_b = (delta - mean_b).square().sum(0)
            if not self.count:
                self.mean[name], self.m2[name] = mean_b, m2_b
                continue
            shift = mean_b - self.mean[name]
            self.mean[name] = self.mean[name] + shift * (b / total)
            self.m2[name] = self.m2[name] + m2_b + shift.square() * (self.count * b / total)
        self.count = total

    def honest(self, n: int, malicious: Sequence[int], device: torch.device) -> Honest:
        """What the attack knows of the round's benign updates (zeros where it knows none), and the ``malicious``
        clients' own uniform draws (on the CPU: the same numbers on every device)."""
        zeros = {k: torch.zeros(ref.shape, dtype=torch.float64, device=device) for k, ref in self.reference.items()}
        mean = {k: self.mean.get(k, zeros[k]) for k in zeros}
        std = {k: (self.m2[k] / (self.count - 1)).sqrt() if self.count > 1 else zeros[k] for k in zeros}
        rows = None if self.rows is None else \
            {k: torch.cat(v) if v else zeros[k].unsqueeze(0) for k, v in self.rows.items()}
        seed, rnd = self.adversary.seed, self.round

        def uniform(name: str) -> torch.Tensor:
            shape = tuple(self.reference[name].shape)
            return torch.stack([torch.rand(shape, generator=torch_gen(seed, ATTACKERS, rnd, k, _name_seed(name), 1),
                                           dtype=torch.float64) for k in malicious]).to(device)

        return Honest(mean, std, rows, n, len(malicious), uniform)

    def result(self, reduce: bool = False) -> Upload:
        collude = self.adversary.attack.collude
        if self.held and collude is not None:
            held = concat_uploads(self.held)
            if self.partial:
                self._observe(held)  # their own updates, as they trained them
            params = dict(held.params)
            device = next(iter(params.values())).device
            crafted = collude(self.honest(self.passed + len(held.client_ids), held.client_ids, device),
                              self.adversary.cfg.params)
            for name, ref in self.reference.items():
                theta = params[name]
                params[name] = (ref.to(theta.device).double() + crafted[name]).to(theta.dtype).expand_as(theta).clone()
            self.inner.add(Upload(held.client_ids, params, held.num_samples, held.extra, dict(held.screened)))
        return self.inner.result(reduce)


def _client_noise(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """Standard normal draws of ``shape`` from a malicious client's own generator (on the CPU: the same numbers on
    every device)."""
    return torch.randn(shape, generator=gen)


def _name_seed(name: str) -> int:
    """A stable integer for a parameter name (Python's hash() is salted per process)."""
    return zlib.crc32(name.encode())
