"""hetfed from Python: load a config, build a federation, run, reload, predict (sweeps: :mod:`hetfed.api_sweep`).

Everything a notebook needs is here (and re-exported by ``import hetfed``); none
of it requires reaching into ``hetfed.engine``. Tables come back as pandas
DataFrames — pandas is the optional extra ``hetfed[pandas]`` (``pip install
'hetfed[pandas]'``): the command line does not need it, and it is imported only
when a table is asked for. Worked examples: ``docs/api.md``.

    >>> import hetfed
    >>> config = hetfed.load_config(overrides={"train.rounds": 5})
    >>> fed = hetfed.build_federation(config)
    >>> fed.heterogeneity["gamma"]            # doctest: +SKIP
    >>> run = hetfed.run(config)              # doctest: +SKIP
    >>> run.results()                         # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from hetfed.config import Config, as_given, build_config, choose_methods, warn_unread
from hetfed.config_io import config_source, parse_overrides, read_yaml
from hetfed.environment import refuse_unknown
from hetfed.errors import ConfigError, RunError
from hetfed.runs.rundir import CHECKPOINTS, CONFIG, METRICS

if TYPE_CHECKING:
    import pandas as pd

__all__ = ["Federation", "Model", "Run", "build_federation", "load_config", "open_run", "report", "run"]


def _pandas():
    try:
        import pandas as pd
    except ImportError:
        raise ImportError("hetfed's tables are pandas DataFrames: pip install 'hetfed[pandas]' "
                          "(or pandas itself)") from None
    return pd


# ------------------------------------------------------------------ configs


def load_config(source: str | Path | dict | Config | None = None,
                overrides: dict[str, Any] | list[str] | None = None,
                methods: list[str] | str | None = None) -> Config:
    """A validated :class:`~hetfed.config.Config` from a YAML file, a dict, a Config, or the defaults (None).

    ``overrides`` are dotted keys, as ``--set`` takes them: ``{"train.rounds": 5}``
    or ``["train.rounds=5"]``. Bad keys or values raise :class:`hetfed.ConfigError`
    naming the key, the value and what is allowed — a key of one component, or two that do not go together.
    ``methods`` (a list, or names with commas between them): only the source's methods of these names, in this
    order, each as the source has it (its parameters and own train settings), as ``--methods`` chooses them — before
    the overrides, whose ``methods.N`` counts them.
    """
    from hetfed.runs.plan import check_config

    extra = parse_overrides(overrides) if isinstance(overrides, list) else dict(overrides or {})
    path = source if isinstance(source, str | Path) else None
    if isinstance(source, Config):
        raw = as_given(source)
    elif isinstance(source, dict):
        raw = source
    elif source is None or path is not None:
        raw = read_yaml(path) if path is not None else {}
    else:
        raise ConfigError(f"config source {type(source).__name__} is not allowed: expected a path, a dict, a Config or "
                          "None")
    if methods is not None:
        names = methods.split(",") if isinstance(methods, str) else list(methods)
        raw = choose_methods(raw, names, extra, config_source(path, False), named=("methods =", "an override of"))
    config = warn_unread(build_config(raw, extra, config_source(path, bool(extra))))
    check_config(config)  # the checks between components (hetfed.runs.plan), as `hetfed run` makes them
    return config


def _config(config: str | Path | dict | Config | None) -> Config:
    """The config a call runs with, once this process's ``HETFED_*`` variables are all ones hetfed reads."""
    refuse_unknown()
    return config if isinstance(config, Config) else load_config(config)


# ------------------------------------------------------------------ federations


@dataclass(eq=False)
class Federation:
    """The simulated clients of a config: who holds what, and how heterogeneous they are.

    ``x`` arrays are in the model's input space (after ``embed``), so they can be
    fed to :meth:`Model.predict` of a run made with the same config.
    """

    config: Config
    _prepared: Any = field(repr=False)

    @property
    def n_clients(self) -> int:
        return self._prepared.federation.n_clients

    @property
    def n_classes(self) -> int:
        return self._prepared.federation.n_classes

    @property
    def heterogeneity(self) -> dict[str, Any]:
        """Γ, Γ_IID (± sd), ΔΓ = Γ − Γ_IID, label skew, and what they were measured on."""
        return self._prepared.heterogeneity.as_dict()

    @property
    def warnings(self) -> list[str]:
        return list(self._prepared.warnings)

    def clients(self) -> pd.DataFrame:
        """One row per client: train/val/test sizes, opted out, and its label skew (EMD to the pooled labels) on
        the rows Γ is measured on (``heterogeneity.on``: each client's training data by default) — the number
        ``hetfed partition`` prints, in the column ``label_emd_<on>``."""
        pd = _pandas()
        fed, het = self._prepared.federation, self._prepared.heterogeneity
        return pd.DataFrame({
            "client": np.arange(fed.n_clients),
            "train": [len(i) for i in fed.train], "val": [len(i) for i in fed.val], "test": [len(i) for i in fed.test],
            "opted_out": np.asarray(fed.opted_out, dtype=bool),
            f"label_emd_{het.measured_on}": het.label_emd,
        }).set_index("client")

    def class_counts(self) -> pd.DataFrame:
        """Clients × classes: how many samples of each class each client holds (all splits)."""
        pd = _pandas()
        counts = self._prepared.federation.class_counts()
        return pd.DataFrame(counts, columns=[f"class {c}" for c in range(counts.shape[1])]).rename_axis("client")

    def client_data(self, client: int, split: str = "train") -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` of one client's ``train``, ``val`` or ``test`` split."""
        fed = self._prepared.federation
        if split not in ("train", "val", "test"):
            raise ConfigError(f"split {split!r} is not allowed: expected 'train', 'val' or 'test'")
        if not 0 <= client < fed.n_clients:
            raise ConfigError(f"client {client} is not allowed: expected 0 … {fed.n_clients - 1}")
        idx = getattr(fed, split)[client]
        return fed.x[idx], fed.y[idx]

    def global_test(self) -> tuple[np.ndarray, np.ndarray]:
        """``(x, y)`` of the balanced global test set every method is scored on."""
        fed = self._prepared.federation
        return np.asarray(fed.x_global_test), np.asarray(fed.y_global_test)

    def export(self, out: str | Path, nodes: int | None = None) -> list[Path]:
        """These clients as ``nodes`` SuperNodes' own files in ``out`` (``hetfed partition --export``): the nodes'
        files, ``federation.yaml`` and ``nodes.txt``; a deployment of them gives this simulation's numbers."""
        from hetfed.partition_export import export_nodes

        data = self._prepared.data
        return export_nodes(self.config, self._prepared.federation, out, nodes, data.class_names if data else ())

    def plot(self, path: str | Path | None = None):
        """The client × class heat map and the 2-D view coloured by client (a figure, or saved to ``path``)."""
        from hetfed.analysis.figures import plot_partition

        return plot_partition(self._prepared.federation, path, seed=self.config.seed)


def build_federation(config: str | Path | dict | Config | None = None) -> Federation:
    """Load, embed and partition the data of ``config`` and measure the clients' heterogeneity."""
    from hetfed.pipeline import prepare

    cfg = _config(config)
    return Federation(cfg, prepare(cfg, progress=False))


# ------------------------------------------------------------------ runs


@dataclass(eq=False)
class Model:
    """A trained model of a run: the global one, or each client's personalised one.

    ``predict(x)`` uses the server's model (local parameters as for a client never
    seen in training); ``predict(x, client=k)`` client k's own: its local parameters
    (CGAU rows, FedMoE mixture, …), its row of what the server keeps for each client
    (FedFomo, pFedHN, FedCAC …), the model fitted to its own rows where the method
    fits one as it evaluates (kNN-Per, Per-FedAvg, pFedFDA, IFCA, CFL: built from the
    run's federation), or, for a method whose clients hold the global model, that.
    """

    method: str
    algorithm: Any = field(repr=False)
    shared: dict = field(repr=False)
    client_states: dict | None = field(default=None, repr=False)
    view: str | None = None
    #: what the server sent its clients beside its model, where they predict with it (:func:`hetfed.interface.served`)
    served: dict | None = field(default=None, repr=False)
    #: the federation's size (every client holds the global model); None: only the clients whose states were saved
    n_clients: int | None = None
    #: the run's federation (``hetfed.partition.Federation``), built when a client's model is fitted to its own rows
    federation: Callable[[], Any] | None = field(default=None, repr=False)

    @property
    def clients(self) -> list[int]:
        """The clients whose personal parameters were saved."""
        return list(self.client_states["client_ids"]) if self.client_states else []

    def predict_proba(self, x: np.ndarray, client: int | None = None) -> np.ndarray:
        """Class probabilities, ``[n, classes]``."""
        import torch

        from hetfed.engine.types import ServerState
        from hetfed.interface import global_params

        algo = self.algorithm
        xt = torch.as_tensor(np.asarray(x, dtype=np.float32))
        with torch.no_grad():
            if client is None:
                if self.view not in (None, algo.capabilities.federated_view):
                    raise ConfigError(f"client=None is not allowed for {self.method}: it is each client's own model "
                                      f"(the global one is {algo.capabilities.federated_view!r}); expected client= "
                                      f"one of {_ids(self._holders())}")
                missing = [k for k in algo.model.shared_names if k not in self.shared]
                if missing:  # FedPer's head, LG-FedAvg's body, IFCA's k models, Local: no whole model on the server
                    raise ConfigError(f"client=None is not allowed for {self.method}: its server keeps no whole model "
                                      f"(it lacks {missing[0]!r}"
                                      f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''}); expected "
                                      f"client= one of {_ids(self._holders())}")
                params = global_params(algo, ServerState(self.shared))
                logits = algo.model.forward(params, xt.unsqueeze(0), None)[0]
            else:
                logits = self._client_logits(xt, client)
        probs = logits.float().softmax(-1) if logits.shape[-1] > 1 else logits
        return probs.cpu().numpy()

    def _client_logits(self, x: Any, client: int) -> Any:
        """Client ``client``'s model's logits of ``x``: its broadcast row, its saved state and, where the method fits
        its model to the client's data, those rows (:class:`hetfed.interface.FitsToData`)."""
        from hetfed.interface import broadcast_of, client_predictor

        algo = self.algorithm
        bc = broadcast_of(self.shared, self.served)
        if algo.capabilities.per_client and self.served is None:
            raise ConfigError(f"client predictions of this saved {self.method} run are not possible: its server keeps "
                              "a row per client (Broadcast.personal), which runs written before hetfed saved it "
                              "beside the model (checkpoints/<model>-served.pt) lack; expected client=None where it "
                              "has a global model, or the run's metrics (metrics.csv, summary.json)")
        holders = self._holders(bc)
        if client not in holders:
            raise ConfigError(f"client {client} is not allowed: {self.method} has a model of its own for "
                              f"{_ids(holders)}; expected one of them or client=None (the global model)")
        saved = self.client_states or {}
        row = self.clients.index(client) if client in self.clients else None
        states = {} if row is None else {k: v[row: row + 1] for k, v in saved["states"].items()}
        bc = bc.for_clients([client])
        pred = client_predictor(algo, bc, states, 1, lambda: self._own_rows(client), self.view)
        return pred.model.forward(pred.params, x.unsqueeze(0), None)[0]

    def _holders(self, bc: Any = None) -> list[int]:
        """The clients with a model to predict with: those of the federation, of the server's rows where it keeps
        one per client, and of the saved states where the clients keep parameters of their own (Ditto's, CGAU's,
        FedPer's: a client never sampled saved none)."""
        from hetfed.interface import fits_to_data, own_parameters

        algo = self.algorithm
        personal = bc is not None and bool(bc.personal)
        ids = list(range(self.n_clients)) if self.n_clients is not None else self.clients
        if personal:
            rows = set(bc.personal_ids or range(len(next(iter(bc.personal.values())))))
            ids = [k for k in ids if k in rows]
        if own_parameters(algo) and (self.client_states or not (personal or fits_to_data(algo))):
            saved = set(self.clients)
            ids = [k for k in ids if k in saved]
        return ids

    def _own_rows(self, client: int) -> Any:
        """Client ``client``'s training and validation rows, as a method that fits its model to them reads them."""
        import torch

        from hetfed.engine.evaluate import ClientEvalData

        if self.federation is None:
            raise ConfigError(f"client predictions of {self.method} need the client's own data, which this model was "
                              "loaded without; expected a model from hetfed.open_run(dir).model(...)")
        fed = self.federation()
        train, val = np.asarray(fed.train[client]), np.asarray(fed.val[client])
        rows = np.concatenate([train, val])
        x, y = torch.as_tensor(np.asarray(fed.x)[rows]), torch.as_tensor(np.asarray(fed.y)[rows]).long()
        return ClientEvalData([client], x, y, [np.arange(0)], [np.arange(len(train), len(rows))], x[:0], y[:0],
                              fed.n_classes, train=[np.arange(len(train))])

    def predict(self, x: np.ndarray, client: int | None = None) -> np.ndarray:
        """Predicted class of every row of ``x``."""
        return self.predict_proba(x, client).argmax(-1)


def _method_of(cfg: Config, row: str):
    """The configured method behind a row of the results (the views of a method that has them — FedMoE's —
    are rows of their own)."""
    from hetfed.algorithms import registry
    from hetfed.runs.summary import row_name

    for m in cfg.methods:
        views = registry.get(m.algorithm).capabilities.views
        if row == m.label and not views:
            return m, None
        for view in views:
            if row == row_name(m, view):
                return m, view
    raise ConfigError(f"method {row!r} is not allowed: expected one of the run's rows")


def _ids(ids: list[int]) -> str:
    return "no client" if not ids else (f"clients {ids}" if len(ids) <= 8 else f"{len(ids)} clients ({ids[0]} … "
                                                                               f"{ids[-1]})")


@dataclass(eq=False)
class Folder:
    """A folder hetfed wrote, read back: a run's or a sweep's."""

    dir: Path

    def __post_init__(self) -> None:
        self.dir = Path(self.dir)  # a folder's name as typed (``hetfed.Run("runs/x")``) reads as its path


@dataclass(eq=False)
class Run(Folder):
    """A run directory read back: its config, summary, metrics and models."""

    @cached_property
    def config(self) -> Config:
        from hetfed.config import load_run_config

        return load_run_config(self.dir / CONFIG)

    @cached_property
    def summary(self) -> dict:
        """summary.json (a clear error for a run that did not complete)."""
        from hetfed.runs.rundir import read_summary

        return read_summary(self.dir)

    @property
    def methods(self) -> list[str]:
        return list(self.summary["methods"])

    def metrics(self) -> pd.DataFrame:
        """metrics.csv as a DataFrame: method, round, split (summary/client/train), client, metric, value."""
        pd = _pandas()
        return pd.read_csv(self.dir / METRICS, dtype={"client": str})

    def curves(self, metric: str = "global_accuracy") -> pd.DataFrame:
        """A learning curve per method: rounds × methods (``train_loss`` every round, the rest per evaluation)."""
        from hetfed.analysis.results import read_curves

        pd = _pandas()
        curves = read_curves(self.dir / METRICS, metric)
        if not curves:
            df = self.metrics()
            known = sorted(df.loc[df["client"] == "all", "metric"].unique())
            raise ConfigError(f"metric {metric!r} is not in this run's curves: expected one of {known}")
        return pd.DataFrame({m: pd.Series(dict(points)) for m, points in curves.items()}).rename_axis("round")

    def per_client(self, metric: str = "local_accuracy") -> pd.DataFrame:
        """Each method's per-client values at its best round: clients × methods."""
        from hetfed.analysis.report import per_client, read_metrics

        pd = _pandas()
        rows = read_metrics(self.dir / METRICS)
        cols = {m: per_client(rows, m, metric, s.get("best_round")) for m, s in self.summary["methods"].items()}
        return pd.DataFrame({m: pd.Series(v, dtype=float) for m, v in cols.items() if v}).rename_axis("client")

    def client_findings(self, finding: str = "lambda", method: str | None = None) -> pd.DataFrame:
        """What a method's server found about each client, round by round (Agnostic FL's λ_k, ``finding="lambda"``):
        clients × rounds. ``method``: whose, when several methods found it."""
        from hetfed.analysis.report import read_metrics
        from hetfed.analysis.results import client_findings

        pd = _pandas()
        grids = client_findings(read_metrics(self.dir / METRICS, ",train,"))
        named = sorted({f for f, _ in grids})
        if finding not in named:
            raise ConfigError(f"finding {finding!r} is not among this run's findings of each client: expected one of "
                              f"{named}")
        whose = [m for f, m in grids if f == finding]
        if method is None and len(whose) > 1 or method is not None and method not in whose:
            raise ConfigError(f"method = {method!r}: finding {finding!r} was found by {whose}; name one of them")
        rounds, clients, values = grids[finding, method or whose[0]]
        return pd.DataFrame(values, index=pd.Index(clients, name="client"), columns=pd.Index(rounds, name="round"))

    def results(self) -> pd.DataFrame:
        """One row per method: its best model's metrics (and the final round's global accuracy)."""
        pd = _pandas()
        out = []
        for label, m in self.summary["methods"].items():
            out.append({"method": label, **m["best"], "final_global_accuracy": m["final"].get("global_accuracy"),
                        "best_round": m.get("best_round"), "seconds_per_round": m.get("seconds_per_round")})
        return pd.DataFrame(out).set_index("method")

    def model(self, method: str | None = None, which: str = "best") -> Model:
        """A trained model of ``method`` (default: the run's first) — ``which``: ``best``, ``final`` or ``checkpoint``.

        FedMoE's views are methods of their own here (``mixture``, ``finetuned``,
        ``local``, ``fedavg``): personal views need ``predict(x, client=k)``.
        ``checkpoint``: a failed or killed run's method in progress, from its last
        resumable checkpoint (the best model so far, every client's local state).
        """
        import torch

        from hetfed.algorithms import algorithm_for

        if which not in ("best", "final", "checkpoint"):
            raise ConfigError(f"which={which!r} is not allowed: expected 'best', 'final' or 'checkpoint'")
        cfg = self.config
        if which == "checkpoint":
            return self._from_checkpoint(method or cfg.methods[0].label)
        methods = self.methods
        method = method or methods[0]
        if method not in methods:
            raise ConfigError(f"method {method!r} is not allowed: this run has {methods}")
        mcfg, view = _method_of(cfg, method)
        label = mcfg.label
        shape, n_classes = self._shapes()
        algo = algorithm_for(cfg, mcfg, shape, n_classes)
        ckpt = self.dir / CHECKPOINTS
        path = ckpt / (f"{label}-global-best.pt" if view else f"{label}-{which}.pt")
        if not path.is_file():
            raise RunError(f"{path} is missing: this run saved no {which} model for {method}")
        shared = torch.load(path, map_location="cpu", weights_only=True)
        clients_path, served_path = ckpt / f"{label}-clients.pt", path.with_name(f"{path.stem}-served.pt")
        states = torch.load(clients_path, map_location="cpu", weights_only=True) if clients_path.is_file() else None
        served = torch.load(served_path, map_location="cpu", weights_only=True) if served_path.is_file() else None
        return Model(method, algo, shared, states, view or None, served, self.summary.get("n_clients"),
                     lambda: self._federation)

    @cached_property
    def _federation(self) -> Any:
        """The run's clients (its partition, without Γ), for a model fitted to a client's own rows: built once for
        every model and client of this run read back."""
        return build_federation(load_config(self.config, {"heterogeneity.gamma": False}))._prepared.federation

    def _from_checkpoint(self, method: str) -> Model:
        """The model of the method a failed or killed run was training, from ``checkpoints/resume.pt``."""
        from hetfed.algorithms.build import run_for
        from hetfed.engine.client_store import ClientStore
        from hetfed.engine.types import OPT_PREFIX
        from hetfed.interface import reported, served
        from hetfed.runs.checkpoint import read_checkpoint

        payload = read_checkpoint(self.dir)
        current = payload.get("current") if payload else None
        mcfg, _ = _method_of(self.config, method)
        if payload is None:
            every = self.config.method_train(mcfg).checkpoint_every
            raise RunError(f"method {method!r} has no checkpoint in {self.dir}: the run wrote none before it stopped "
                           f"(train.checkpoint_every = {every!r}; auto writes the first once a minute has passed); "
                           "expected a run killed after its first checkpoint")
        if current is None or current["label"] != method:
            running = current["label"] if current else None
            raise RunError(f"method {method!r} has no checkpoint in {self.dir} (in progress: {running}); expected the "
                           "method a failed run was training — finished methods load with which='best' or 'final'")
        result = current["result"]
        server = result.best_server or result.server
        fed = self._federation
        algo = run_for(self.config, mcfg, fed).algo  # bound to the federation, as its server was (pFedHN's rows)
        store = ClientStore(fed.n_clients)
        store.load_state_dict(current["states"])
        ids, stacked = store.stacked(keep=lambda name: not name.startswith(OPT_PREFIX))
        states = {"client_ids": ids, "states": stacked} if ids else None
        return Model(method, algo, {k: v.cpu() for k, v in reported(algo, server).params.items()}, states, None,
                     served(algo, server), fed.n_clients, lambda: fed)

    def _shapes(self) -> tuple[tuple[int, ...], int]:
        s = self.summary
        if "input_shape" in s and "n_classes" in s:
            return tuple(s["input_shape"]), int(s["n_classes"])
        fed = build_federation(self.config)._prepared.federation  # runs written before the shapes were recorded
        return tuple(fed.input_shape), fed.n_classes

    def report(self, out: str | Path | None = None) -> Path:
        return report(self.dir, out)


def run(config: str | Path | dict | Config | None = None, out: str | Path | None = None,
        progress: bool = True, report: bool = True) -> Run:
    """Train every configured method on one federation; the run directory, read back.

    ``progress``: what is happening, as ``hetfed run`` shows it (a bar on a terminal, a line every 10 s in a
    log or a notebook's captured output); False for silence. ``report``: False draws no figures and no report.html
    (``hetfed run --no-report``; :meth:`Run.report` draws them later)."""
    from hetfed.analysis.present import present_run
    from hetfed.runs.runner import run_experiment

    result = run_experiment(_config(config), out=out, progress=_flag("progress", progress),
                            present=present_run if _flag("report", report) else None)
    return Run(Path(result.run_dir))


def _flag(name: str, value: object) -> bool:
    """A switch of the API: True or False, else the command line's one-line refusal."""
    if not isinstance(value, bool):
        raise ConfigError(f"{name}={value!r} is not allowed: expected True or False")
    return value


def open_run(directory: str | Path) -> Run:
    """A run directory written earlier (by ``hetfed run`` or :func:`run`)."""
    d = Path(directory)
    if not (d / CONFIG).is_file():
        raise RunError(f"{str(d)!r} is not a run directory: expected config.yaml in it (written by hetfed run)")
    return Run(d)


def report(directory: str | Path, out: str | Path | None = None) -> Path:
    """Write report.html for a run or sweep directory; returns its path."""
    from hetfed.analysis.report import write_report

    return write_report(directory, out)
