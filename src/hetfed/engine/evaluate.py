"""Evaluation of a round: each client scores its own model on its own validation/test sets (the client step
:meth:`hetfed.interface.Algorithm.evaluate_client`, run by the executor: :func:`client_scores`), and the server its own
model on the balanced global test set (:func:`global_test`, :func:`scores`); only those numbers come back. The server
turns them into the run's metrics: :mod:`hetfed.engine.summary`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar, cast

import numpy as np
import torch

from hetfed.engine.rng import GLOBAL_TEST, numpy_rng
from hetfed.engine.types import Params, cell_counts, index_on, take_rows, tensor_bytes
from hetfed.models.base import Derived, Model
from hetfed.models.softmax import row_cross_entropy

if TYPE_CHECKING:
    from hetfed.config import TrainConfig
    from hetfed.partition import Federation

@dataclass(frozen=True, eq=False)
class Evaluation:
    metrics: dict[str, float]
    per_client: dict[str, list[float]]  # metric → value per client (in the order of the evaluated ids)


#: each federation's global test sets as made (:func:`global_test`), by (size, seed, device); a federation's
#: go with it
_GLOBAL_TESTS: weakref.WeakKeyDictionary[Federation, dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor]]] = \
    weakref.WeakKeyDictionary()


def global_test(fed: Federation, train: TrainConfig, seed: int,
                device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """The global test set an evaluation scores, on ``device``: all of it, or a fixed class-balanced
    subset of ``train.global_test_size`` samples (the same at every evaluation).

    Made once per federation, size, seed and device and then shared, read-only: by the loop (the server's
    scores), the executor (the clients') and the personalised views, and by every run of a sweep on the same
    federation (on a GPU, one copy instead of three per run)."""
    key = (train.global_test_size, seed, str(torch.device(device)))
    made = _GLOBAL_TESTS.setdefault(fed, {})
    if key not in made:
        made[key] = _global_test(fed, train.global_test_size, seed, device)
    return made[key]


def _global_test(fed: Federation, n: int | None, seed: int,
                 device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    x, y = np.asarray(fed.x_global_test, dtype=np.float32), np.asarray(fed.y_global_test, dtype=np.int64)
    if n is not None and n < len(y):
        classes = np.unique(y)
        per = max(1, n // len(classes))
        rng = numpy_rng(seed, GLOBAL_TEST, 0)
        idx = np.sort(np.concatenate([rng.permutation(np.flatnonzero(y == c))[:per] for c in classes]))
        x, y = x[idx], y[idx]
    return torch.as_tensor(x, device=device), torch.as_tensor(y, device=device)


@dataclass(frozen=True, eq=False)
class ClientEvalData:
    """What a stack of clients evaluates on: its own validation and test sets.

    The balanced global test set is public (the dataset's own test split); a
    personalised model is also scored on it *by the client*, since only the
    client holds its personal parameters.
    """

    client_ids: list[int]
    x: torch.Tensor  # the train pool on the device (clients' val/test indices point into it)
    y: torch.Tensor
    test: list[np.ndarray]
    val: list[np.ndarray]
    x_global: torch.Tensor
    y_global: torch.Tensor
    n_classes: int
    #: which clients score the global test set with a personal model (None: all); the others report NaN
    global_mask: list[bool] | None = None
    #: per client, its training indices into the pool (methods that adapt before they predict: Per-FedAvg)
    train: list[np.ndarray] | None = None
    #: per client, the rows of ``x_global``/``y_global`` that are its global test set, all of one length (None: all
    #: of them): clients of several runs scored together, each on its own run's set (a stacked sweep)
    global_index: list[np.ndarray] | None = None


@dataclass(frozen=True, eq=False)
class Predictor:
    """A model and the stacked parameters each client predicts with."""

    model: Model
    params: Params
    personalised: bool  # True when the clients' parameters differ (scored on the global test set by each)


def size_blocks(sizes: np.ndarray, waste: float = 2.0, call_rows: float | None = None) -> list[np.ndarray]:
    """Clients grouped by size so that padding each group to its largest costs at most ``waste`` × its samples —
    or, given ``call_rows`` (what one more forward call costs, in rows of the model's arithmetic), the groups of
    the least total cost ``Σ (call_rows + width × clients)`` (:func:`_cheapest_blocks`).

    Clients of a natural federation differ by 100× (Shakespeare's roles: 12 to 6 667 windows); padded
    to the largest in one stack, scoring them computed ~10× the samples there are.
    """
    if call_rows is not None:
        return _cheapest_blocks(sizes, call_rows)
    order = np.argsort(sizes, kind="stable")
    blocks: list[np.ndarray] = []
    current: list[int] = []
    total = 0
    for k in order:
        size = int(sizes[k])
        if current and (len(current) + 1) * size > waste * (total + size):  # sorted: size is the block's width
            blocks.append(np.array(current))
            current, total = [], 0
        current.append(int(k))
        total += size
    if current:
        blocks.append(np.array(current))
    return blocks


def _cheapest_blocks(sizes: np.ndarray, call_rows: float) -> list[np.ndarray]:
    """The clients, sorted by size, cut into the contiguous blocks of least ``Σ (call_rows + width × clients)``
    (each block padded to its widest). A dynamic programme over the cut points: the least cost of the first ``j``
    clients is ``call_rows + s_j·j + min_i (best_i − s_j·i)``, a minimum over lines of slope ``−i`` queried at the
    non-decreasing widths ``s_j``, kept as their lower envelope (the convex hull trick): linear in the clients, so a
    stacked sweep's thousands of sets cost milliseconds, not the seconds of the quadratic programme."""
    order = np.argsort(sizes, kind="stable")
    s = sizes[order].astype(np.float64).tolist()
    n = len(s)
    best, cut = [0.0] * (n + 1), [0] * (n + 1)
    hull: list[int] = [0]  # cut points i whose lines best[i] − i·x form the lower envelope, slopes decreasing
    head = 0

    def above(a: int, b: int, c: int) -> bool:  # line b is nowhere below both a's and c's (a < b < c)
        return (best[c] - best[a]) * (b - a) <= (best[b] - best[a]) * (c - a)

    for j in range(1, n + 1):
        x = s[j - 1]  # the block ending at client j − 1 is as wide as it
        while head + 1 < len(hull) and best[hull[head + 1]] - hull[head + 1] * x <= best[hull[head]] - hull[head] * x:
            head += 1
        i = hull[head]
        best[j], cut[j] = call_rows + x * (j - i) + best[i], i
        while len(hull) - head >= 2 and above(hull[-2], hull[-1], j):
            hull.pop()
        hull.append(j)
    blocks, j = [], n
    while j > 0:
        blocks.append(order[cut[j]:j])
        j = cut[j]
    return blocks[::-1]


#: on a CPU, what one more forward call of a block costs (its operators' fixed costs, the gathers), in floats of a
#: row's activations (``Model.activation_floats``, the measure of a row's work every model has): a model whose row is
#: cheap — an MLP of digits, ~600 floats — is scored in few wide blocks (~200 rows of padding are worth a call), one
#: whose row is dear — PFLlib's CNN, ~114 000 floats — in blocks padded to ~one row. Measured on PFLlib's protocol
#: (cnn4, 20 Dirichlet-0.1 clients' validation and test sets, one thread): 8.7 s a scoring in 4 blocks bounded by
#: padding (at most 2×, the rule before), 3.5 s in 17 blocks; a digits MLP's ~0.4 ms either way.
CPU_CALL_FLOATS = 120_000


def call_rows(model: Model, x: torch.Tensor) -> float | None:
    """What one more forward call of ``model`` costs, in rows (:data:`CPU_CALL_FLOATS` over a row's activation
    floats; a model derived from another, as the other's), on a CPU; None on an accelerator, whose launches cost
    more than its rows: its blocks are bounded by padding alone (:func:`size_blocks`' ``waste``)."""
    if x.device.type != "cpu":
        return None
    while isinstance(model, Derived):
        model = model.base
    return CPU_CALL_FLOATS / max(model.activation_floats(1), 1)


@torch.no_grad()
def predict(model: Model, params: Params, x: torch.Tensor, index: list[np.ndarray]) -> list[torch.Tensor]:
    """Logits of each stacked model on its own index set → list of tensors.

    Clients of similar sizes are stacked and padded together (:func:`size_blocks`), so unequal
    clients do not all pay for the largest. The blocks' padded indices are built once per set of index arrays
    and device (:func:`device_index`): an evaluation scores the same sets every round.
    """
    n = len(index)
    if max((len(i) for i in index), default=0) == 0:
        return [torch.zeros(0, model.n_classes) for _ in index]
    out: list[torch.Tensor | None] = [None] * n
    for block in _padded_blocks(index, x.device, call_rows(model, x)):
        logits = model.forward(_rows(params, block.rows), take_rows(x, block.pad), None)
        for row, k in enumerate(block.clients):
            out[k] = logits[row, : len(index[k])]
    return out  # type: ignore[return-value]


def _rows(params: Params, rows: torch.Tensor | None) -> Params:
    """A block's models of the stack (all of it when ``rows`` is None)."""
    return params if rows is None else {name: take_rows(v, rows.to(v.device)) for name, v in params.items()}


@torch.no_grad()
def set_scores(model: Model, params: Params, x: torch.Tensor, y: torch.Tensor, sets: list[list[np.ndarray]]
               ) -> tuple[list[float], list[float]]:
    """Each stacked model's cross-entropy sum and correct predictions on each of its index sets (``sets[s][k]``:
    model k's s-th set, its validation or test samples), as ``[s · n + k]``: computed in one pass over every set and
    read back once. What :func:`predict` and a sum over its per-model slices give, without the slices (an
    evaluation of 200 clients cut its logits into 400 slices and joined them again); each set's samples are summed
    in their order, as there. Every set of every model is blocked by size together (:func:`_set_pass`: a stack's
    validation and test sets in one forward where their sizes are alike, not a forward each)."""
    n = len(sets[0]) if sets else 0
    plan = _set_pass(sets, x.device, call_rows(model, x))
    sums = torch.zeros(2, len(sets) * n, dtype=torch.float64, device=y.device)
    if plan.blocks:
        rows = torch.cat([model.forward(_rows(params, block_rows), take_rows(x, pad), None).flatten(0, 1)
                          .index_select(0, flat) for block_rows, pad, flat in plan.blocks])
        label = y[plan.samples]
        sums[0].index_add_(0, plan.owner, row_cross_entropy(rows, label).double())
        sums[1].index_add_(0, plan.owner, (rows.argmax(-1) == label).double())
    loss_sum, correct = sums.cpu().tolist()
    return loss_sum, correct


class _SetPass(NamedTuple):
    """:func:`set_scores`'s blocks (:func:`_padded_blocks` of every set of every model, the empty ones left out):
    each block's models (its rows of the stack; None: all of it), padded indices and sample positions; then every
    block's samples' rows of the pool (``samples``) and whose set each is (``owner``: ``s · n + k``)."""

    blocks: list[tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]]
    samples: torch.Tensor
    owner: torch.Tensor


def _set_pass(sets: list[list[np.ndarray]], device: torch.device, call: float | None = None) -> _SetPass:
    """:class:`_SetPass` of ``sets`` on ``device`` (cached), blocked as :func:`size_blocks` with ``call_rows``
    ``call``."""
    n = len(sets[0]) if sets else 0
    index = [a for each in sets for a in each]

    def build() -> _SetPass:
        blocks = [b for b in _padded_blocks(index, device, call) if b.pad.shape[1]]
        models = [b.clients % max(n, 1) for b in blocks]  # set s of model k is array s · n + k
        rows = [None if np.array_equal(m, np.arange(n)) else torch.as_tensor(m, device=device) for m in models]

        def joined(parts: list[torch.Tensor]) -> torch.Tensor:
            return (torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)).to(device, torch.int64)

        return _SetPass([(r, b.pad, b.flat) for r, b in zip(rows, blocks, strict=True)],
                        joined([b.samples for b in blocks]), joined([b.owner for b in blocks]))
    return _cached(f"sets of {n}, call {call}", index, device, build)


#: device tensors built from index arrays, kept while the arrays live in it: (kind, device, ids) → (arrays, value,
#: bytes held), oldest first; at most ``_INDEX_CACHE_BYTES`` of arrays and tensors (an evaluation of a sampled subset
#: of clients names new arrays every round: the oldest go)
_INDEX_CACHE: dict[tuple[Any, ...], tuple[tuple[np.ndarray, ...], Any, int]] = {}
_INDEX_CACHE_BYTES = 64 * 2**20
_INDEX_LOCK = threading.Lock()
_T = TypeVar("_T")


def _cached(kind: str, index: list[np.ndarray], device: torch.device, build: Callable[[], _T]) -> _T:
    """``build()`` once per (kind, device, the very same index arrays): an evaluation scores the same clients'
    sets every round, and each copy of indices to a GPU waits for the device."""
    key = (kind, str(device), tuple(id(a) for a in index))
    with _INDEX_LOCK:  # the runs of a stacked sweep evaluate on threads
        hit = _INDEX_CACHE.get(key)
    if hit is not None and len(hit[0]) == len(index) and all(a is b for a, b in zip(hit[0], index, strict=True)):
        return cast(_T, hit[1])
    value = build()
    size = sum(np.asarray(a).nbytes for a in index) + tensor_bytes(value)
    if size > _INDEX_CACHE_BYTES:
        return value
    with _INDEX_LOCK:
        held = sum(entry[2] for entry in _INDEX_CACHE.values())
        while _INDEX_CACHE and held + size > _INDEX_CACHE_BYTES:
            held -= _INDEX_CACHE.pop(next(iter(_INDEX_CACHE)))[2]  # the oldest
        _INDEX_CACHE[key] = (tuple(index), value, size)  # the arrays held: their ids cannot be reused while cached
    return value


def device_index(index: list[np.ndarray], device: torch.device) -> torch.Tensor:
    """The index arrays concatenated, as one int64 tensor on ``device`` (cached: :func:`_cached`)."""
    def build() -> torch.Tensor:
        flat = np.concatenate([np.asarray(i, dtype=np.int64) for i in index]) if index else np.zeros(0, np.int64)
        return torch.as_tensor(flat, device=device)
    return _cached("flat", index, device, build)


class _Block(NamedTuple):
    """A block of stacked index arrays of similar sizes: its arrays' places in the list (``clients``), their indices
    padded to the block's widest (``pad`` ``[b, width]``), its rows of the stack (None: all of it, in order), the
    positions of the real indices in the flattened ``pad`` (``flat``), and on the host (tensors, so the cache counts
    their bytes) those indices in that order (``samples``) and whose array each is (``owner``)."""

    clients: np.ndarray
    pad: torch.Tensor
    rows: torch.Tensor | None
    flat: torch.Tensor
    samples: torch.Tensor
    owner: torch.Tensor


def _padded_blocks(index: list[np.ndarray], device: torch.device, call: float | None = None) -> list[_Block]:
    """:func:`predict`'s and :func:`set_scores`'s blocks of arrays of similar sizes (:func:`size_blocks`, with
    ``call_rows`` ``call``), on ``device`` (cached)."""
    def build() -> list[_Block]:
        blocks = []
        n = len(index)
        for block in size_blocks(np.array([len(i) for i in index], dtype=np.int64), call_rows=call):
            width = max(len(index[k]) for k in block)
            pad = np.zeros((len(block), width), dtype=np.int64)
            valid = np.zeros((len(block), width), dtype=bool)
            for row, k in enumerate(block):
                pad[row, : len(index[k])] = index[k]
                valid[row, : len(index[k])] = True
            rows = None if np.array_equal(block, np.arange(n)) else torch.as_tensor(block, device=device)
            blocks.append(_Block(block, torch.as_tensor(pad, device=device), rows,
                                 torch.as_tensor(np.flatnonzero(valid), device=device), torch.from_numpy(pad[valid]),
                                 torch.from_numpy(np.broadcast_to(block[:, None], pad.shape)[valid])))
        return blocks
    return _cached(f"blocks, call {call}", index, device, build)


@torch.no_grad()
def client_losses(model: Model, params: Params, x: torch.Tensor, y: torch.Tensor,
                  index: list[np.ndarray]) -> torch.Tensor:
    """Each stacked client model's mean cross-entropy ``[n]`` on its own index set (0 for a client without one):
    FedMoE's validation loss for early stopping, FedFomo's held-out loss."""
    logits = predict(model, params, x, index)
    labels = y.index_select(0, device_index(index, y.device))  # every set's, one copy kept (one a set: a wait each)
    out, at = [], 0
    for idx, lg in zip(index, logits, strict=True):
        out.append(row_cross_entropy(lg, labels[at : at + len(idx)]).mean() if len(idx)
                   else torch.zeros((), device=y.device))
        at += len(idx)
    return torch.stack(out)


def scores(logits: torch.Tensor, y: torch.Tensor) -> dict[str, float]:
    """Accuracy and mean cross-entropy of ``logits`` ``[N, C]`` on labels ``y`` (and their sum and N)."""
    if len(y) == 0:
        return scores_of(0.0, 0.0, 0)
    loss, correct = score_sums(logits, y).tolist()  # one read from the device
    return scores_of(loss, correct, len(y))


def score_sums(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """:func:`scores`'s cross-entropy sum and correct count, ``[2]`` on the device: many models' read back at
    once (a stacked sweep's servers: :func:`hetfed.interface.evaluate_servers`)."""
    loss_sum = row_cross_entropy(logits, y).sum()
    hits = (logits.argmax(-1) == y).sum().to(loss_sum.dtype)  # a count < 2²⁴: exact in float32
    return torch.stack([loss_sum, hits])


#: a CPU sums at most this many values of a row in one thread (torch's grain size): a longer set's sum is split
#: between threads, in another order than a row of a stack's (:func:`stacked_score_sums`)
ONE_THREAD_SUM = 32_768


def stacked_score_sums(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """:func:`score_sums` of each model of a stack, ``[R, 2]`` from ``logits`` ``[R, N, C]`` and labels ``y``
    ``[R, N]``: row r's numbers are :func:`score_sums` of ``logits[r]`` to the bit on a CPU while ``N`` ≤
    :data:`ONE_THREAD_SUM` (a stack's sums take its rows in one thread each, as a set's alone; checked in the
    tests); a longer set's are each model's own (the runs of a stacked sweep give their numbers alone). Why: 20
    runs' servers took ~0.1 ms of small operations each."""
    if logits.device.type == "cpu" and y.shape[-1] > ONE_THREAD_SUM:
        return torch.stack([score_sums(lg, labels) for lg, labels in zip(logits, y, strict=True)])
    loss_sum = row_cross_entropy(logits, y).sum(-1)
    return torch.stack([loss_sum, (logits.argmax(-1) == y).sum(-1).to(loss_sum.dtype)], -1)


def auc(y: np.ndarray, score: np.ndarray) -> float:
    from sklearn.metrics import roc_auc_score

    if len(np.unique(y)) < 2:
        return float("nan")
    return float(roc_auc_score(y, score))


#: at most this many input floats in one block of personal models scoring the global test set
GLOBAL_BLOCK_FLOATS = 50_000_000


@torch.no_grad()
def client_scores(pred: Predictor, data: ClientEvalData) -> dict[str, list[Any]]:
    """Per-client metrics of a stack: local test accuracy/loss, validation loss sums, AUC, global test set.

    A personalised model's global-test accuracy is also split by the client's own
    classes and the others (``global_accuracy_own`` / ``_other``, see
    :func:`own_class_masks`). Only these numbers leave a client. ``val_loss_sum``/``val_n`` let the server
    pool validation losses weighted by size; ``global_probs`` (binary tasks,
    personalised models) lets it compute the AUC of the clients' mean prediction
    on the public global test set.

    The sums are computed for the whole stack at once and read back from the device once (a read per client
    and set made an evaluation on a GPU wait for the device ~4 times per client).
    """
    binary = data.n_classes == 2
    n = len(data.client_ids)
    loss_sum, correct = set_scores(pred.model, pred.params, data.x, data.y, [data.test, data.val])
    # scores_of of every set at once (a 20-run sweep's 200 clients called it 400 times an evaluation)
    sizes = np.array([len(i) for i in (*data.test, *data.val)], dtype=np.int64)
    sums, hits = np.array(loss_sum), np.array(correct)
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy, loss = np.where(sizes > 0, hits / sizes, np.nan), np.where(sizes > 0, sums / sizes, np.nan)
    sums = np.where(sizes > 0, sums, 0.0)
    local, val = slice(0, n), slice(n, 2 * n)
    out: dict[str, list[Any]] = {"local_accuracy": accuracy[local].tolist(), "local_loss": loss[local].tolist(),
                                 "local_n": sizes[local].tolist(), "val_loss": loss[val].tolist(),
                                 "val_accuracy": accuracy[val].tolist(), "val_loss_sum": sums[val].tolist(),
                                 "val_n": sizes[val].tolist()}
    if binary:
        out["local_auc"] = _local_auc(pred, data)
    if pred.personalised:
        _global_scores(pred, data, out)
    return out


def _local_auc(pred: Predictor, data: ClientEvalData) -> list[float]:
    """Each client's AUC on its local test set (binary tasks; NaN without one): every set's labels and scores read
    back at once (two reads a client made a GPU's evaluation wait twice a client)."""
    tests = predict(pred.model, pred.params, data.x, data.test)
    labels = data.y.index_select(0, device_index(data.test, data.y.device)).cpu().numpy()
    scores = (torch.cat([logits.softmax(-1)[:, 1] for logits in tests]) if tests else torch.zeros(0)).cpu().numpy()
    ends = np.cumsum([len(idx) for idx in data.test])
    return [auc(labels[end - len(idx) : end], scores[end - len(idx) : end]) if len(idx) else float("nan")
            for idx, end in zip(data.test, ends, strict=True)]


def _segments(index: list[np.ndarray], device: torch.device) -> torch.Tensor:
    """Which index array each position of :func:`device_index`'s concatenation came from (cached)."""
    sizes = [len(i) for i in index]
    return _cached("segments", index, device, lambda: torch.repeat_interleave(
        torch.arange(len(index), device=device), torch.as_tensor(sizes, device=device), output_size=sum(sizes)))


def scores_of(loss_sum: float, correct: float, n: int) -> dict[str, float]:
    """:func:`scores` from a segment's sums (:func:`score_sums`) of ``n`` samples."""
    if n == 0:
        return {"accuracy": float("nan"), "loss": float("nan"), "loss_sum": 0.0, "n": 0}
    return {"accuracy": int(correct) / n, "loss_sum": loss_sum, "loss": loss_sum / n, "n": n}


def _global_scores(pred: Predictor, data: ClientEvalData, out: dict[str, list[Any]]) -> None:
    """Each personal model (of the clients ``data.global_mask`` names) on the whole global test set, in blocks of
    clients; a block's sums read back once."""
    binary = data.n_classes == 2
    n = len(data.client_ids)
    mask = data.global_mask if data.global_mask is not None else [True] * n
    rows = [j for j in range(n) if mask[j]]
    out["global_accuracy"], out["global_loss"] = [float("nan")] * n, [float("nan")] * n
    own = own_class_masks(data)
    if own is not None:
        out["global_accuracy_own"], out["global_accuracy_other"] = [float("nan")] * n, [float("nan")] * n
    if binary:
        out["global_probs"] = [None] * n
    index = data.global_index
    n_global = len(data.y_global) if index is None else len(index[0]) if index else 0
    if not n_global:
        return
    width = max(int(np.prod(data.x_global.shape[1:])), data.n_classes)
    block = max(1, GLOBAL_BLOCK_FLOATS // max(n_global * width, 1))
    for start in range(0, len(rows), block):  # a full pass over the global test set per client: in blocks
        part = rows[start : start + block]
        every = len(part) == n
        at = None if every else index_on(part, data.x_global.device)  # copied without waiting: one a block
        sub = pred.params if at is None else {k: v.index_select(0, at.to(v.device)) for k, v in pred.params.items()}
        # [p, n_global, C]; the whole set as one view for every model of the block (gathered for each, a block of
        # 200 CGAU models' first layers took twice as long: the same numbers, tested)
        if index is None:
            logits = pred.model.forward(sub, data.x_global.expand(len(part), *data.x_global.shape), None)
            labels = data.y_global.expand(len(part), n_global)
        else:
            sets = [index[j] for j in part]
            logits = torch.stack(predict(pred.model, sub, data.x_global, sets))
            labels = data.y_global[device_index(sets, data.y_global.device)].view(len(part), n_global)
        loss = row_cross_entropy(logits, labels)
        hit = (logits.argmax(-1) == labels).double()
        columns = [loss.double().sum(1) / n_global, hit.mean(1)]
        if own is not None:
            mine = (own if at is None else own.index_select(0, at.to(own.device))).double()
            columns += [(hit * mine).sum(1) / mine.sum(1), (hit * (1 - mine)).sum(1) / (1 - mine).sum(1)]
        values = torch.stack(columns).cpu().tolist()
        for col, j in enumerate(part):
            out["global_loss"][j], out["global_accuracy"][j] = values[0][col], values[1][col]
            if own is not None:
                out["global_accuracy_own"][j], out["global_accuracy_other"][j] = values[2][col], values[3][col]
            if binary:
                out["global_probs"][j] = logits[col].softmax(-1)


def own_class_masks(data: ClientEvalData) -> torch.Tensor | None:
    """Per client, which global test samples are of its *own* classes ``[n, n_global]`` (bool): those whose share
    of the client's training labels is above uniform (1/C). None when the training indices are not known.

    Why: a personalised model is scored on the balanced global test set to see what it
    kept of the federation's knowledge; the classes a client rarely sees are where
    personalisation forgets (fine-tuning) or must route to the global model (FedMoE's gate).
    """
    if data.train is None:
        return None
    n, c = len(data.train), data.n_classes
    device = data.y.device
    counts = cell_counts(_segments(data.train, device) * c + data.y[device_index(data.train, device)].long(), n, c)
    own = counts.double() / counts.sum(1, keepdim=True).clamp(min=1) > 1.0 / c  # [n, C]: each row's labels' shares
    if data.global_index is None:
        return own[:, data.y_global]
    labels = data.y_global[device_index(data.global_index, device)].view(n, -1)  # each client's own global set
    return own.gather(1, labels)


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """The mean of ``values`` where ``mask`` holds; NaN where it never does."""
    return float(values[mask].mean()) if bool(mask.any()) else float("nan")
