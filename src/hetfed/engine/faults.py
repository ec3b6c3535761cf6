"""Clients that fail, straggle or attack — simulated, every choice drawn from the run seed.

- **dropout** (``train.client_dropout``): a sampled client fails to report with
  probability p, drawn per (round, client) — the same whichever executor runs it;
- **stragglers** (``train.stragglers``, or ``train.clock`` in seconds: :mod:`hetfed.engine.clock`): each client
  has a fixed speed drawn from the run seed; a client whose round would pass the ``deadline`` is dropped (late),
  as a synchronous server with a round timeout does;
- **attackers** (``attack.*``, :class:`Adversary`): a fixed share of the opted-in
  clients poisons what it uploads (sign flip, scaling, Gaussian noise) or the
  labels it trains on (label flipping).

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
from hetfed.engine.attacks import ATTACKS
from hetfed.engine.clock import Clock
from hetfed.engine.local import LocalSchedule
from hetfed.engine.rng import ATTACKERS, DROPOUT, numpy_rng, torch_gen
from hetfed.engine.types import Broadcast, Upload

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


class Adversary:
    """The malicious clients of a run and what they do to their uploads or labels."""

    def __init__(self, cfg: AttackConfig, fed: Federation, seed: int, n_classes: int):
        self.cfg, self.seed, self.n_classes = cfg, seed, n_classes
        self.attack = ATTACKS.get(cfg.kind)
        self.malicious = malicious_clients(cfg, fed.opted_out, seed)

    @property
    def active(self) -> bool:
        return self.attack.acts and bool(self.malicious.any())

    def training_labels(self, y: torch.Tensor, train_indices: Sequence[np.ndarray]) -> torch.Tensor:
        """The pool's labels as the clients train on them: flipped ``y → C − 1 − y`` on malicious clients' samples."""
        if not self.attack.flips_labels:
            return y
        out = y.clone()
        for k in np.flatnonzero(self.malicious):
            idx = torch.as_tensor(train_indices[int(k)], device=y.device)
            out[idx] = self.n_classes - 1 - y[idx]
        return out

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


def _client_noise(gen: torch.Generator, shape: tuple[int, ...]) -> torch.Tensor:
    """Standard normal draws of ``shape`` from a malicious client's own generator (on the CPU: the same numbers on
    every device)."""
    return torch.randn(shape, generator=gen)


def _name_seed(name: str) -> int:
    """A stable integer for a parameter name (Python's hash() is salted per process)."""
    return zlib.crc32(name.encode())
