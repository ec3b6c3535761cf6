"""What the server learns in a run (#76): the attack ``leakage.kind`` names, run by an honest-but-curious server on
what it really holds, scored against the clients' data that only the simulation knows.

- **Membership** (an attack that reads a model: ``loss_threshold``, ``lira``): the model the run reports (the best
  by validation) is queried on up to ``leakage.samples`` of the clients' training samples (members) and as many of
  their held-out test samples (non-members), each client contributing as many of one as of the other: the server's
  whole model (``global_*``), and the model each client predicts with where the method gives it one of its own
  (``personal_*``: personal parameters, or each of the method's views) — each client's samples scored by its model.
  A calibrated attack's reference samples are the public global test set, which no client trains on.
- **Inversion** (an attack that reads an update: ``dlg``, ``inverting_gradients``, ``label_counts``): what client
  ``leakage.client`` uploads in round ``leakage.round``, as the server decodes it — compression applied, but not the
  chain's clipping and DP noise, which the server itself applies (central DP protects the released model, not the
  update from the server). The attack reads it with the parameters the server sent; what the client never sends
  it does not know: CGAU's rows are taken as for an unseen client, a personal head (FedRep's) freshly initialised.
  Scored by PSNR (each reconstruction against the
  client's sample closest to it), SSIM for images, and the labels recovered: the reconstruction's labels found among
  the client's (as a multiset), over as many as the update went over.

Every number is one line of ``summary.json``'s ``leakage`` (and ``runs.csv``'s ``leakage.*``) beside the accuracy.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch
from scipy.spatial.distance import cdist

from hetfed.engine.evaluate import global_test
from hetfed.engine.rng import LEAKAGE, derive_seed, torch_gen
from hetfed.engine.types import Broadcast, Seen, ServerState
from hetfed.executors.updates import RoundObserver
from hetfed.interface import global_params, own_parameters
from hetfed.leakage import ATTACKS, Observed, Queried, run
from hetfed.leakage import metrics as scored
from hetfed.run_spec import RunSpec

if TYPE_CHECKING:
    from hetfed.config import LeakageConfig
    from hetfed.executors.inprocess import Executor, InProcessExecutor
    from hetfed.partition import Federation


@dataclass
class Found:
    """What an attack learnt: its numbers (``summary.json``'s ``leakage``) and the arrays report.html draws
    (``leakage/<row>.npz`` in the run: the membership scores of members and non-members, ``<model>_members`` and
    ``<model>_others``; an inversion's reconstructions ``guess`` beside the client's samples nearest them,
    ``truth``)."""

    numbers: dict[str, float] = field(default_factory=dict)
    arrays: dict[str, np.ndarray] = field(default_factory=dict)

    def add(self, other: Found) -> None:
        self.numbers.update(other.numbers)
        self.arrays.update(other.arrays)


def reads(leakage: LeakageConfig) -> str:
    """What the configured attack reads: ``"model"``, ``"update"`` or ``"nothing"``."""
    return ATTACKS.get(leakage.kind).reads


def _balanced(fed: Federation, clients: list[int], most: int, rng: np.random.Generator
              ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per client as many of its training samples (members) as of its test samples (non-members), at most ``most``
    in all of each: a pooled AUC is then not a comparison of clients (a client with more test than training samples
    drawn, and a better model, would make non-members look like members)."""
    each = max(1, math.ceil(most / max(len(clients), 1)))
    members, others = [], []
    for k in clients:
        n = min(len(fed.train[k]), len(fed.test[k]), each)
        members.append(np.sort(rng.choice(fed.train[k], size=n, replace=False)))
        others.append(np.sort(rng.choice(fed.test[k], size=n, replace=False)))
    return members, others


def _scores(leakage: LeakageConfig, model: Any, params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor,
            members: np.ndarray, others: np.ndarray, seed: int, reference: tuple[torch.Tensor, torch.Tensor] | None
            ) -> tuple[np.ndarray, np.ndarray]:
    """The attack's scores of the members and of the others, asked in one query (an online attack trains its shadows
    on the candidates it is asked about: all of them at once, as the membership game poses them)."""
    index = np.concatenate([members, others]).astype(np.int64)
    if not len(index):
        return np.zeros(0), np.zeros(0)
    at = torch.as_tensor(index, device=x.device)
    scores = np.asarray(run(leakage.kind, Queried(model, params, x[at], y[at], reference),
                            leakage.params.model_dump(), seed))
    return scores[: len(members)], scores[len(members):]


def _membership(members: list[np.ndarray], others: list[np.ndarray], prefix: str) -> Found:
    ins, outs = np.concatenate(members), np.concatenate(others)
    got = scored.membership(ins, outs)
    return Found({f"{prefix}_auc": got["auc"], f"{prefix}_tpr_at_1pct_fpr": got["tpr_at_0.01_fpr"]},
                 {f"{prefix}_members": ins, f"{prefix}_others": outs})


def membership(spec: RunSpec, executor: Executor, fed: Federation, server: ServerState, leakage: LeakageConfig,
               view: str | None = None) -> Found:
    """The membership attack on the server's model (when the method's server holds a whole one and ``view`` is its
    federated one) and on each client's own model (a method with personal parameters, or ``view``) where the
    clients' models are in process: AUC and TPR at 1 % FPR. On Flower the personal models stay on the nodes, where
    the server cannot query them: the server's own model alone."""
    algo, seed = spec.algo, spec.seed
    pool = getattr(executor, "pool", None)
    if pool is not None:
        x, y = pool.x, pool.y
        reference = (executor.x_global, executor.y_global)  # type: ignore[attr-defined]
    else:  # the samples the server's process drew the federation from (the simulation's, to score the attack)
        device = next(iter(server.params.values())).device
        x = torch.as_tensor(np.asarray(fed.x, dtype=np.float32), device=device)
        y = torch.as_tensor(np.asarray(fed.y, dtype=np.int64), device=device)
        reference = global_test(fed, spec.train, seed, device)
    # reference: public, no client's — what a calibrated attack trains on
    clients = [k for k in range(fed.n_clients) if not fed.opted_out[k] and len(fed.train[k]) and len(fed.test[k])]
    rng = np.random.default_rng(derive_seed(seed, LEAKAGE))
    out = Found()
    caps = algo.capabilities
    params = {k: v[0] for k, v in global_params(algo, server).items()} if caps.server_model else {}
    whole = bool(params) and {s.name for s in algo.model.specs()} <= set(params)  # FedRep's server: a body alone
    members, others = _balanced(fed, clients, leakage.samples, rng)
    if whole and view in (None, caps.federated_view):
        ins, outs = _scores(leakage, algo.model, params, x, y, np.concatenate(members), np.concatenate(others), seed,
                            reference)
        out.add(_membership([ins], [outs], "global"))
    if clients and pool is not None and (view is not None or own_parameters(algo)):
        bc = algo.broadcast(server, server.round)
        mine, theirs = [], []
        at = {k: i for i, k in enumerate(clients)}
        for chunk, pred in cast("InProcessExecutor", executor).predictors(bc, clients, view):
            for j, k in enumerate(chunk):
                params = {name: v[j] for name, v in pred.params.items()}
                ins, outs = _scores(leakage, pred.model, params, x, y, members[at[k]], others[at[k]], seed, reference)
                mine.append(ins)
                theirs.append(outs)
        out.add(_membership(mine, theirs, "personal"))
    return out


class InversionObserver(RoundObserver):
    """Takes what the server holds of client ``leakage.client``'s update in round ``leakage.round``
    (:meth:`~hetfed.executors.inprocess.InProcessExecutor.watch`: in process at once, on Flower from the round's
    replies) and attacks it against the parameters the round sent; :attr:`found` is what the attack learnt."""

    def __init__(self, spec: RunSpec, fed: Federation, leakage: LeakageConfig):
        self.spec, self.fed, self.leakage = spec, fed, leakage
        self.found = Found()
        self._waiting: tuple[Broadcast, Executor] | None = None  # the round's broadcast and the executor to ask

    def sending(self, rnd: int, bc: Broadcast, clients: list[int], executor: Executor) -> None:
        k = self.leakage.client
        if rnd != self.leakage.round:
            return
        if k not in clients:  # not sampled, dropped or late that round: the server received nothing of it
            self.found = Found({"sent": 0.0})
            return
        seen = executor.watch(bc, k)
        if seen is not None:
            self._attack(bc, seen)
        else:  # the round's model is replaced before the replies are read: keep what was sent
            self._waiting = (replace(bc, params={n: v.detach().clone() for n, v in bc.params.items()}), executor)

    def trained(self, rnd: int, metrics: dict[str, float]) -> None:
        if self._waiting is None or rnd != self.leakage.round:
            return
        (bc, executor), self._waiting = self._waiting, None
        seen = executor.watched()
        if seen is None:  # its node failed or did not reply in time
            self.found = Found({"sent": 0.0})
        else:
            self._attack(bc, seen)

    def _attack(self, bc: Broadcast, seen: Seen) -> None:
        self.found = Found({"sent": 1.0, "clients_in_update": float(len(seen.clients))})
        self.found.add(attack_upload(self.spec, self.fed, bc, seen, self.leakage))


def observed(spec: RunSpec, fed: Federation, bc: Broadcast, seen: Seen) -> Observed:
    """What the server holds of a client's update as the attack reads it: the parameters the server sent (what the
    client keeps to itself taken as for an unseen client, or freshly initialised from the run's seed), the update
    on the names it sent, and the protocol (step size, steps, the samples they went over — of every client in the
    update where it came summed with others')."""
    device, algo, seed = next(iter(bc.params.values())).device, spec.algo, spec.seed
    unseen = algo.model.local_for_unseen_client(device)
    guessed = {k: v.to(device) for k, v in algo.model.init_shared(torch_gen(seed, LEAKAGE)).items()
               if k not in bc.params}  # a part the server never holds (FedRep's head): a fresh initialisation
    params = {**guessed, **{k: v.detach() for k, v in bc.params.items()}, **unseen}
    update = {k: (v[0].to(device) - bc.params[k]).detach() for k, v in seen.params.items()}
    return Observed(algo.model, params, update, float(bc.lr), tuple(fed.input_shape), steps=1,
                    batch=sum(spec.schedule.samples_seen(len(fed.train[k])) for k in seen.clients))


def attack_upload(spec: RunSpec, fed: Federation, bc: Broadcast, seen: Seen, leakage: LeakageConfig) -> Found:
    """The inversion attack on what the server holds of a client's update, scored against the samples it went over
    (the client's, or those of everyone summed with it)."""
    target = observed(spec, fed, bc, seen)
    got = run(leakage.kind, target, leakage.params.model_dump(), derive_seed(spec.seed, LEAKAGE, leakage.client))
    at = np.concatenate([fed.train[k] for k in seen.clients])
    truth_x = np.asarray(fed.x[at], dtype=np.float32).reshape(len(at), *fed.input_shape)
    truth_y = np.asarray(fed.y[at])
    guess_y = got.y.cpu().numpy()
    # of the labels it could have recovered — the update went over min(n_k, its steps × B) samples of each client
    matched = scored.labels_recovered(truth_y, guess_y) * len(truth_y)
    out = Found({"labels_recovered": matched / min(len(truth_y), len(guess_y)) if len(guess_y) else math.nan,
                 "reconstructed": float(len(got.x))})
    if len(got.x):
        out.add(_image_scores(truth_x, got.x.detach().reshape(len(got.x), *fed.input_shape).cpu().numpy()))
    return out


def _image_scores(truth: np.ndarray, guess: np.ndarray) -> Found:
    """Each reconstruction against the client's sample closest to it (a batch's order is not recoverable): mean
    PSNR in dB over the data's range, and SSIM where the samples are images."""
    low, high = float(truth.min()), float(truth.max())
    span = max(high - low, 1e-12)
    guess = np.clip(guess, low, high)
    flat_t, flat_g = truth.reshape(len(truth), -1), guess.reshape(len(guess), -1)
    # a distance matrix, reconstructions × samples (never their differences: under SecAgg+ the samples are every
    # client's of the round, 42 000 Fashion-MNIST images against 200 guesses)
    nearest = cdist(flat_g, flat_t, "sqeuclidean").argmin(1)
    out = Found({"psnr": scored.psnr(truth[nearest] - low, guess - low, data_range=span)},
                {"truth": truth[nearest], "guess": guess})
    if truth.ndim == 3 and min(truth.shape[1:]) >= 3:
        with contextlib.suppress(ImportError):  # scikit-image (hetfed[privacy]) absent: PSNR alone
            out.numbers["ssim"] = scored.ssim((truth[nearest] - low) / span, (guess - low) / span)
    return out
