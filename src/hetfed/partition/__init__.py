"""Partitioners: split a dataset's train pool over K simulated clients.

Every partitioner is one module of this package, a pure function ``(features, labels, cfg, rng,
client_ids) -> list of index arrays`` (one per client, disjoint) registered under its
``partition.kind`` (:data:`PARTITIONERS`; a plugin may register more). :func:`make_federation` then splits
each client's samples into its own train / validation / test sets, stratified by
label so they mirror the client's label (and feature) distribution, builds one
balanced global test set from the dataset's test split, and marks a fraction of
clients opted out.

Kinds (seed papers in brackets):

- ``iid``: a shuffled split into near-equal parts.
- ``shards`` [Fed-FSNet, after McMahan et al.]: sort by label, cut into
  ``n_shards`` shards, ``shards_per_client`` each. Shards are cut *within* classes
  (each class gets a number of shards proportional to its size), so no shard
  straddles two labels and a client holds at most ``shards_per_client`` classes.
  ``shard_cut: sorted`` is McMahan et al.'s literal recipe instead: sort by label,
  cut into ``n_shards`` equal shards; a shard at a class boundary holds two labels.
- ``majority`` [FedMoE]: each client has ``majority_classes`` (2) majority classes
  holding a fraction ``p`` of its data, the rest spread evenly over the other
  classes; ``p = 2/C`` (0.2 for 10 classes) is IID.
- ``dirichlet`` [FedMoE, Hsu et al.]: per class, proportions over clients drawn
  from Dir(α); clients short of ``min_size`` samples are topped up from the largest (one pass). With
  ``samples_per_client`` (FedMoE: 100 each), each client draws its class shares
  from Dir(α) instead; when a class runs out, the client takes the shortfall
  from its other classes in proportion to its shares.
- ``feature_clusters`` [CGAU]: PCA of the features to ``pca_components`` (2) dims,
  k-means per class with k = K, one centroid per class per client, then a
  fraction ``shuffle`` of samples reassigned to uniformly random clients.
  *Matching clusters across classes* (the paper leaves it open): the first
  class's centroids anchor the clients; each further class's centroids are
  matched to the anchors by the Hungarian algorithm on Euclidean distance in the
  PCA plane, and each anchor moves to the running mean of its matched centroids.
  So a client's clusters lie in the same region of the embedding — the feature
  skew is coherent across classes, as a real device's would be.
- ``natural``: clients given by ids in the data.
- ``pathological`` [NIID-Bench's #C = k]: every client holds exactly ``classes_per_client`` classes (its first
  class k mod C, the others drawn, by default), each class split in equal parts over its holders — drawn as
  Flower Datasets' ``PathologicalPartitioner`` draws it.
- ``quantity`` [NIID-Bench's quantity skew]: client sizes from Dir(β) above ``min_size``, samples at random.

``opt_out`` is orthogonal: a fraction ``q`` of the clients is marked opted-out;
the engine never samples them for the global model. So are the skews of :mod:`hetfed.partition.shift`, applied to the
clients' samples after any split: ``feature_noise`` (NIID-Bench's noise-based feature skew: client k's features
carry Gaussian noise of standard deviation ``feature_noise · k/(K−1)``), ``rotations`` (the clients in contiguous
groups, each group's images rotated by its angle: IFCA's rotated MNIST) and ``label_swaps`` (each group with its
own pair of labels exchanged: concept shift).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hetfed.config import PartitionConfig
from hetfed.errors import PartitionError
from hetfed.registry import ComponentParams, Registry, describe_params

Indices = list[np.ndarray]


@dataclass(frozen=True)
class Partitioner:
    """A registered partitioner: ``split(x, y, cfg, rng, client_ids)`` → one index array per client.

    ``ordered``: each client's samples keep the data's order (natural clients of a sequence: a
    Shakespeare role's windows), so its train / validation / test split is cut in time order."""

    split: Callable[..., Indices]
    ordered: bool = False
    Params: type[ComponentParams] = ComponentParams  # its own keys, beside partition.kind


#: every partitioner, by ``partition.kind`` (one module of this package each)
def _described(p: Partitioner) -> dict[str, Any]:
    return {"summary": " ".join((p.split.__doc__ or "").split()), "ordered": p.ordered,
            "params": describe_params(p.Params)}


PARTITIONERS: Registry[Partitioner] = Registry("partitioner", __name__, "partition.kind", describe=_described,
                                               exclude=frozenset({"shift"}))  # skews beside any kind, not a kind


def register(kind: str, split: Callable[..., Indices], ordered: bool = False,
             Params: type[ComponentParams] = ComponentParams) -> Callable[..., Indices]:  # noqa: N803
    """Register ``split(x, y, cfg, rng, client_ids)`` as ``partition.kind = kind``; ``Params``: its own keys
    (``cfg.params``)."""
    PARTITIONERS.register(kind, Partitioner(split, ordered, Params))
    return split


@dataclass(frozen=True, eq=False)
class Federation:
    """Who holds which sample.

    Index arrays point into ``x``/``y`` (the dataset's train pool); the global test
    set is separate (``x_global_test``/``y_global_test``), balanced over classes.
    """

    x: np.ndarray
    y: np.ndarray
    train: tuple[np.ndarray, ...]
    val: tuple[np.ndarray, ...]
    test: tuple[np.ndarray, ...]
    x_global_test: np.ndarray
    y_global_test: np.ndarray
    n_classes: int
    opted_out: np.ndarray  # bool per client
    input_shape: tuple[int, ...] = ()
    kind: str = ""
    params: dict = field(default_factory=dict)
    #: unlabeled inputs the server holds (``server_data``; FedDF), None when it holds none
    server_x: np.ndarray | None = None
    #: their labels, kept only for a combine rule that trains on a labelled root set (FLTrust); None otherwise
    server_y: np.ndarray | None = None

    @property
    def n_clients(self) -> int:
        return len(self.train)

    def client_indices(self, k: int) -> np.ndarray:
        """All samples client k holds (train ∪ val ∪ test)."""
        return np.concatenate([self.train[k], self.val[k], self.test[k]])

    def measured_rows(self, k: int, on: str) -> np.ndarray:
        """The rows of client k that Γ is measured on (``heterogeneity.on``): its training samples, or all it holds.
        In-process Γ and the summaries a Flower client sends use the same rows."""
        return self.train[k] if on == "train" else self.client_indices(k)

    def train_sizes(self) -> np.ndarray:
        return np.array([len(t) for t in self.train], dtype=np.int64)

    def has_validation(self, k: int) -> bool:
        """Whether client k holds validation data (best-model selection needs some opted-in client that does)."""
        return len(self.val[k]) > 0

    @property
    def sizes_known(self) -> bool:
        """Whether the server knows its clients' sizes — what a modelled clock times their rounds by
        (:class:`hetfed.engine.clock.Clock`)."""
        return True

    def class_counts(self) -> np.ndarray:
        """K × C counts of each class among each client's samples (all splits)."""
        out = np.zeros((self.n_clients, self.n_classes), dtype=np.int64)
        for k in range(self.n_clients):
            out[k] = np.bincount(self.y[self.client_indices(k)], minlength=self.n_classes)
        return out


@dataclass(frozen=True, eq=False)
class NodesFederation(Federation):
    """The server's view of a federation whose SuperNodes hold their own data: how many clients there are and
    which node holds which (``nodes``: node id, first client id, clients). The data, the splits and the sizes
    stay on the nodes: the index arrays here are empty, and every client is taken to hold validation data
    (one that holds none reports none, and the pooled validation loss leaves it out)."""

    nodes: tuple[tuple[int, int, int], ...] = ()

    def has_validation(self, k: int) -> bool:
        return True

    @property
    def sizes_known(self) -> bool:
        """The sizes stay on the nodes: the rounds are timed by the wall clock."""
        return False


# ---------------------------------------------------------------- helpers


def apportion(total: int, weights: np.ndarray) -> np.ndarray:
    """Split ``total`` into integer parts proportional to ``weights`` (largest remainder)."""
    w = np.asarray(weights, dtype=np.float64)
    if total == 0 or w.sum() <= 0:
        return np.zeros(len(w), dtype=np.int64)
    exact = total * w / w.sum()
    base = np.floor(exact).astype(np.int64)
    rest = total - int(base.sum())
    if rest:
        order = np.argsort(-(exact - base), kind="stable")
        base[order[:rest]] += 1
    return base


def allocate_classes(y: np.ndarray, weights: np.ndarray, rng: np.random.Generator) -> Indices:
    """Give every sample to one client: class c is split over clients by ``weights[:, c]``."""
    return allocate_counts(y, class_counts(y, weights), rng)


def class_counts(y: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """K × C sample counts: class c's samples apportioned over the clients by ``weights[:, c]`` (uniform if all 0)."""
    n_clients, n_classes = weights.shape
    sizes = np.bincount(y, minlength=n_classes)
    out = np.zeros((n_clients, n_classes), dtype=np.int64)
    for c in range(n_classes):
        w = weights[:, c]
        ok = np.all(np.isfinite(w)) and w.sum() > 0
        out[:, c] = apportion(int(sizes[c]), w if ok else np.ones(n_clients))
    return out


def allocate_counts(y: np.ndarray, counts: np.ndarray, rng: np.random.Generator) -> Indices:
    """Each client gets ``counts[k, c]`` random samples of class c; every sample goes to exactly one client.

    One owner array and one stable sort instead of a split per client and class, so
    100 000 clients cost about what 100 do.
    """
    n_clients, n_classes = counts.shape
    owner = np.empty(len(y), dtype=np.int64)
    clients = np.arange(n_clients)
    for c in range(n_classes):
        idx = rng.permutation(np.flatnonzero(y == c))
        owner[idx] = np.repeat(clients, counts[:, c])
    order = np.argsort(owner, kind="stable")  # within a client: increasing sample index
    return [part.astype(np.int64) for part in np.split(order, np.cumsum(np.bincount(owner, minlength=n_clients))[:-1])]


def meet_min_size(counts: np.ndarray, min_size: int, rng: np.random.Generator) -> np.ndarray:
    """Move samples from clients above ``min_size`` to those below it, keeping every class's total.

    A construction, not a retry: the donors give ``Σ deficits`` samples in proportion
    to their surplus (each from its own classes in proportion to what it holds), and
    the clients short of samples take consecutive runs of that pool in a random
    order, so each gets one or two classes, as a small client under a skewed
    Dirichlet draw would. Needs ``min_size × K ≤ N`` (checked by the caller).
    """
    sizes = counts.sum(1)
    deficit = np.maximum(min_size - sizes, 0)
    need = int(deficit.sum())
    if need == 0:
        return counts
    out = counts.copy()
    surplus = np.maximum(sizes - min_size, 0)
    give = apportion(need, surplus)  # ≤ surplus for every donor, since need ≤ Σ surplus
    donors = np.flatnonzero(give)
    for j in donors:
        out[j] -= apportion(int(give[j]), counts[j])  # ≤ counts[j, c] for every class
    pool = (counts - out).sum(0)  # the donated samples per class
    takers = rng.permutation(np.flatnonzero(deficit))
    labels = np.repeat(np.arange(counts.shape[1]), pool)  # class of each donated sample, class by class
    owners = np.repeat(takers, deficit[takers])
    np.add.at(out, (owners, labels), 1)
    return out


def draw_per_client(
    y: np.ndarray, props: np.ndarray, n_per_client: int, rng: np.random.Generator, what: str,
    fallback: bool = False,
) -> Indices:
    """Each client draws ``n_per_client`` samples, class shares ``props[k]``, no reuse.

    When a class runs out, ``fallback=False`` raises; ``fallback=True`` gives the
    shortfall to the client's other classes that still have samples, in
    proportion to its shares (uniformly if it wanted none of them).
    """
    n_clients, n_classes = props.shape
    pools = [list(rng.permutation(np.flatnonzero(y == c))) for c in range(n_classes)]
    out: Indices = []
    for k in range(n_clients):
        room = np.array([len(p) for p in pools])
        if room.sum() < n_per_client:
            raise PartitionError(
                f"partition.samples_per_client = {n_per_client} is not allowed with {what}: "
                f"only {room.sum()} samples are left for client {k}; expected fewer clients or samples per client"
            )
        counts = apportion(n_per_client, props[k])
        if np.any(counts > room):
            if not fallback:
                c = int(np.argmax(counts > room))
                raise PartitionError(
                    f"partition.samples_per_client = {n_per_client} is not allowed with {what}: "
                    f"class {c} runs out of samples at client {k}; "
                    "expected fewer clients or fewer samples per client"
                )
            counts = np.minimum(counts, room)
            while counts.sum() < n_per_client:
                open_ = room > counts
                weights = np.where(open_, props[k], 0.0)
                if weights.sum() <= 0:
                    weights = open_.astype(float)
                extra = np.minimum(apportion(n_per_client - int(counts.sum()), weights), room - counts)
                if extra.sum() == 0:  # rounding put everything on full classes: one at a time
                    extra[np.flatnonzero(open_)[0]] = 1
                counts += extra
        chosen = []
        for label in np.flatnonzero(counts):
            chosen.extend(pools[label][: counts[label]])
            del pools[label][: counts[label]]
        out.append(np.sort(np.asarray(chosen, dtype=np.int64)))
    return out


def classes_present(y: np.ndarray) -> np.ndarray:
    return np.unique(y)


def require_clients(cfg: PartitionConfig, n: int) -> int:
    k = cfg.clients
    if k is None:
        raise PartitionError(f"partition.clients is required for partition.kind = {cfg.kind!r}")
    if k > n:
        raise PartitionError(
            f"partition.clients = {k} is not allowed: the data has only {n} training samples; "
            f"expected at most {n}"
        )
    return k


def require_min_size(min_size: int, k: int, n: int) -> None:
    """``partition.min_size`` for ``k`` clients of a pool of ``n`` samples: refused when the pool cannot give it."""
    if min_size * k > n:
        raise PartitionError(f"partition.min_size = {min_size} is not allowed with {k} clients: it needs "
                             f"{min_size * k} samples but there are {n}; expected min_size ≤ {n // k}")


# ---------------------------------------------------------------- partitioners


def pca_view(x: np.ndarray, components: int, seed: int = 0) -> np.ndarray:
    """The low-dimensional view the clusters are found in (also used for plots)."""
    from sklearn.decomposition import PCA

    flat = x.reshape(len(x), -1)
    n = min(components, flat.shape[1], len(flat))
    return PCA(n_components=n, random_state=seed).fit_transform(flat)


def partition_view(fed, seed: int = 0, max_points: int = 5000) -> dict[str, np.ndarray]:
    """What the federation figures need, small enough to keep with a run.

    ``counts`` (clients × classes, all splits), per-client ``train``/``val``/``test``
    sizes, ``opted_out``, and a 2-D PCA view of at most ``max_points`` samples
    (``xy``, PCA fitted on them: bounded cost at any size) with the client holding
    each (``owner``).
    """
    owner = np.full(len(fed.y), -1)
    for k in range(fed.n_clients):
        owner[fed.client_indices(k)] = k
    held = np.flatnonzero(owner >= 0)
    if len(held) > max_points:
        held = np.sort(np.random.default_rng(seed).choice(held, max_points, replace=False))
    xy = pca_view(fed.x[held], 2, seed=seed) if len(held) > 2 else np.zeros((len(held), 2))
    return {
        "counts": fed.class_counts(),
        "train": np.array([len(i) for i in fed.train]),
        "val": np.array([len(i) for i in fed.val]),
        "test": np.array([len(i) for i in fed.test]),
        "opted_out": np.asarray(fed.opted_out, dtype=bool),
        "xy": xy.astype(np.float32),
        "owner": owner[held],
    }


def partition_indices(
    x: np.ndarray, y: np.ndarray, cfg: PartitionConfig, seed: int, client_ids: np.ndarray | None = None
) -> Indices:
    """The clients' sample indices for the configured kind (before train/val/test)."""
    rng = np.random.default_rng([seed, 0x9A27])
    return PARTITIONERS.get(cfg.kind).split(x, y, cfg, rng, client_ids)


def split_client(idx: np.ndarray, y: np.ndarray, val: float, test: float, rng: np.random.Generator):
    """Stratified train/val/test split of one client's samples (mirrors its labels)."""
    tr, va, te = [], [], []
    for c in np.unique(y[idx]):
        members = rng.permutation(idx[y[idx] == c])
        n_val = int(round(val * len(members)))
        n_test = int(round(test * len(members)))
        while n_val + n_test >= len(members) and n_val + n_test > 0:  # keep one to train on
            if n_test >= n_val:
                n_test -= 1
            else:
                n_val -= 1
        va.append(members[:n_val])
        te.append(members[n_val : n_val + n_test])
        tr.append(members[n_val + n_test :])
    cat = lambda parts: np.sort(np.concatenate(parts)).astype(np.int64) if parts else np.zeros(0, np.int64)  # noqa: E731
    return cat(tr), cat(va), cat(te)


def split_in_order(idx: np.ndarray, val: float, test: float, gap: int):
    """Train, then validation, then test, in time order (samples are consecutive windows of a text).

    ``gap`` samples are left out before each later part, so no window of one split shares a
    character with a window of another (LEAF's split of a Shakespeare role, by time). A client too
    small for all three keeps what fits, training first.
    """
    n = len(idx)
    n_val = int(round(val * n)) if val > 0 else 0
    n_test = int(round(test * n)) if test > 0 else 0
    n_val, n_test = (max(n_val, 1) if val > 0 else 0), (max(n_test, 1) if test > 0 else 0)
    while n_val + n_test + gap * ((n_val > 0) + (n_test > 0)) >= n and n_val + n_test > 0:
        if n_test >= n_val:
            n_test -= 1
        else:
            n_val -= 1
    n_train = n - n_val - n_test - gap * ((n_val > 0) + (n_test > 0))
    train = idx[:n_train]
    va = idx[n_train + gap: n_train + gap + n_val] if n_val else idx[:0]
    te = idx[n - n_test:] if n_test else idx[:0]
    return train.astype(np.int64), va.astype(np.int64), te.astype(np.int64)


def balanced_subset(y: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Indices of an equal number of samples per class (the smallest class's count)."""
    classes = np.unique(y)
    m = min((y == c).sum() for c in classes)
    return np.sort(np.concatenate([rng.choice(np.flatnonzero(y == c), m, replace=False) for c in classes]))


def client_blocks(n_clients: int, k: int) -> list[np.ndarray]:
    """The clients of ``k`` SuperNodes: node P holds the P-th of ``k`` contiguous blocks of the ``n_clients`` clients
    (a simulated deployment's ``partition-id=P num-partitions=K``, and the nodes ``hetfed partition --export``
    writes)."""
    return np.array_split(np.arange(n_clients), k)


def opted_out_mask(n_clients: int, q: float, rng: np.random.Generator) -> np.ndarray:
    """A random ``round(q·K)`` clients opt out (their data never trains the global model)."""
    mask = np.zeros(n_clients, dtype=bool)
    n = int(round(q * n_clients))
    if n:
        mask[rng.choice(n_clients, n, replace=False)] = True
    return mask


def make_federation(data, cfg: PartitionConfig, seed: int) -> Federation:
    """The full Federation from embedded data (any object with x_train, y_train, …)."""
    x, y = data.x_train, data.y_train
    features = getattr(data, "measure_train", None)  # token ids are not features: cluster their bag of words
    parts = partition_indices(x if features is None else features, y, cfg, seed, getattr(data, "client_train", None))
    if int(round(cfg.opt_out * len(parts))) >= len(parts):
        raise PartitionError(
            f"partition.opt_out = {cfg.opt_out} is not allowed with {len(parts)} clients: every client would "
            f"opt out and nobody trains the global model; expected < {1 - 0.5 / len(parts):.3g}"
        )
    empty = [k for k, p in enumerate(parts) if len(p) == 0]
    if empty:
        raise PartitionError(
            f"partition.kind = {cfg.kind!r} left clients {empty[:10]} without data: "
            "expected fewer clients or a less extreme setting"
        )
    rng = np.random.default_rng([seed, 0x5B17])
    from hetfed.partition.shift import shifted  # here: validating a config imports only the chosen partitioner

    x, y = shifted(data, x, y, parts, cfg, seed)
    gap = getattr(data, "sequence_gap", None)
    if gap is not None and PARTITIONERS.get(cfg.kind).ordered:  # a role's windows in time order: by time, as LEAF
        splits = [split_in_order(np.sort(p), cfg.val_fraction, cfg.test_fraction, gap) for p in parts]
    else:
        splits = [split_client(p, y, cfg.val_fraction, cfg.test_fraction, rng) for p in parts]
    gt = balanced_subset(data.y_test, rng) if getattr(data, "balanced_test", True) else np.arange(len(data.y_test))
    return Federation(
        x=x,
        y=y,
        train=tuple(s[0] for s in splits),
        val=tuple(s[1] for s in splits),
        test=tuple(s[2] for s in splits),
        x_global_test=data.x_test[gt],
        y_global_test=data.y_test[gt],
        n_classes=data.n_classes,
        opted_out=opted_out_mask(len(parts), cfg.opt_out, rng),
        input_shape=tuple(getattr(data, "input_shape", x.shape[1:])),
        kind=cfg.kind,
        params=cfg.model_dump(),
    )


def federation_warnings(fed: Federation) -> list[str]:
    """What makes parts of a run's report meaningless, said before it runs.

    Clients without validation data cannot take part in picking the best model
    (or in early stopping); clients without test data have no local accuracy.
    """
    out = []
    eligible = ~np.asarray(fed.opted_out, dtype=bool)
    no_val = [k for k in range(fed.n_clients) if len(fed.val[k]) == 0]
    no_test = [k for k in range(fed.n_clients) if len(fed.test[k]) == 0]
    if no_val and all(len(fed.val[k]) == 0 for k in np.flatnonzero(eligible)):
        out.append(
            f"no opted-in client has validation data ({len(no_val)} of {fed.n_clients} clients have none; "
            f"partition.val_fraction = {fed.params.get('val_fraction')}): 'best' cannot be chosen by validation "
            "loss and early stopping cannot fire — best = final; raise partition.val_fraction or give clients "
            "more samples"
        )
    elif no_val:
        out.append(f"{len(no_val)} of {fed.n_clients} clients have no validation data (too few samples)")
    if no_test and fed.params.get("test_fraction", 1) > 0:  # test_fraction 0: no personal test sets, as asked
        out.append(
            f"{len(no_test)} of {fed.n_clients} clients have no test data: their local accuracy is not "
            "measured (local_accuracy_* cover the others)"
        )
    return out
