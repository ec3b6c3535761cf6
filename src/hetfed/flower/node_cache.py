"""A SuperNode's prepared federation on disk, so each message does not rebuild it.

A deployment's SuperNode starts a fresh ClientApp process for every message, and
rebuilding a simulated federation (load, embed, cut the holdout, partition —
k-means for ``feature_clusters``) costs more than a round of training on small
clients (~1.4 s for the default experiment). The first message of a run builds it
and writes it here; the others read it back (~10 ms). The entry is keyed by
everything that decides the federation (``dataset``, ``embed``, ``partition``,
``server_data`` with ``auto`` resolved by the run's methods, the seed, the code that builds it) and is used only while
the data files
it was built from keep their size and modification time; anything else rebuilds.

``$HETFED_CACHE/federations`` (default ``~/.cache/hetfed/federations``); one
``.npz`` per entry, written atomically, no pickles.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from hetfed.config import Config
from hetfed.partition import Federation

#: what decides a simulated federation (the methods and training settings do not)
FEDERATION_KEYS = ("dataset", "embed", "partition", "server_data", "seed")


def cache_dir() -> Path:
    env = os.environ.get("HETFED_CACHE")
    return (Path(env) if env else Path("~/.cache/hetfed").expanduser()) / "federations"


def federation_key(config: Config) -> str:
    """The entry of ``config``'s federation: its deciding settings and the code that builds it (the size and
    time of hetfed's data and partition modules: an upgraded or edited hetfed rebuilds)."""
    from hetfed.server_data import labelled, wanted

    dumped = config.model_dump(mode="json")
    decides = {k: dumped[k] for k in FEDERATION_KEYS}
    # 'auto' is a holdout or nothing depending on the methods: key by what it resolves to, or a FedAvg run's
    # federation (no holdout) would be reused by a FedDF run of the same data (which trains without the holdout)
    decides["server_data"]["source"] = wanted(config)
    decides["server_data"]["labelled"] = labelled(config)  # a root set's labels (FLTrust) are in the cache
    root = Path(__file__).resolve().parents[1]  # the hetfed package
    code = [[str(p.relative_to(root)), p.stat().st_size, p.stat().st_mtime_ns]
            for p in sorted([*root.glob("data/*.py"), *root.glob("partition/*.py"), root / "pipeline.py",
                             root / "server_data.py"]) if p.is_file()]
    return hashlib.sha256(json.dumps([code, decides], sort_keys=True).encode()).hexdigest()[:24]


def _stamp(sources) -> list[list]:
    out = []
    for s in sources:
        st = os.stat(s["path"])
        out.append([s["path"], st.st_size, st.st_mtime_ns])
    return out


def save(config: Config, fed: Federation, measure: np.ndarray | None, sources) -> None:
    """Write the federation (best effort: a node that cannot write its cache just rebuilds next time)."""
    try:
        stamp = _stamp(sources)
    except OSError:
        return
    arrays: dict[str, np.ndarray] = {"x": np.asarray(fed.x), "y": np.asarray(fed.y),
                                     "x_global_test": np.asarray(fed.x_global_test),
                                     "y_global_test": np.asarray(fed.y_global_test),
                                     "opted_out": np.asarray(fed.opted_out, dtype=bool)}
    for split in ("train", "val", "test"):
        parts = getattr(fed, split)
        arrays[f"{split}_rows"] = np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)
        arrays[f"{split}_sizes"] = np.array([len(p) for p in parts], dtype=np.int64)
    if fed.server_x is not None:
        arrays["server_x"] = np.asarray(fed.server_x)
    if fed.server_y is not None:
        arrays["server_y"] = np.asarray(fed.server_y)
    if measure is not None:
        arrays["measure"] = np.asarray(measure)
    if any(a.dtype == object for a in arrays.values()):
        return  # texts as inputs: not cached (an object array would need a pickle)
    meta = {"n_classes": fed.n_classes, "input_shape": list(fed.input_shape), "kind": fed.kind, "params": fed.params,
            "sources": stamp}
    path = cache_dir() / f"{federation_key(config)}.npz"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
        # numpy's stub types **arrays as allow_pickle
        np.savez(tmp, meta=np.array(json.dumps(meta)), **arrays)  # type: ignore[arg-type]
        os.replace(tmp, path)
    except (OSError, TypeError, ValueError):
        return


def load(config: Config) -> tuple[Federation, np.ndarray | None] | None:
    """The cached federation of ``config`` and its Γ features, or None (absent, stale or unreadable)."""
    path = cache_dir() / f"{federation_key(config)}.npz"
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            meta = json.loads(str(z["meta"]))
            if _stamp([{"path": p} for p, _, _ in meta["sources"]]) != meta["sources"]:
                return None
            splits = {}
            for split in ("train", "val", "test"):
                rows, sizes = z[f"{split}_rows"], z[f"{split}_sizes"]
                splits[split] = tuple(np.split(rows, np.cumsum(sizes)[:-1])) if len(sizes) else ()
            fed = Federation(x=z["x"], y=z["y"], **splits, x_global_test=z["x_global_test"],
                             y_global_test=z["y_global_test"], n_classes=int(meta["n_classes"]),
                             opted_out=z["opted_out"], input_shape=tuple(meta["input_shape"]), kind=meta["kind"],
                             params=meta["params"], server_x=z["server_x"] if "server_x" in z.files else None,
                             server_y=z["server_y"] if "server_y" in z.files else None)
            return fed, (z["measure"] if "measure" in z.files else None)
    except (OSError, KeyError, ValueError):
        return None
