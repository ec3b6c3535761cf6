"""Experiment tracking: a run's metrics mirrored to TensorBoard and MLflow as they are written.

``metrics.csv`` stays the record. A tracker mirrors its round-level rows (the ``summary``
evaluation rows and the ``train`` rows; not the per-client rows, which would be thousands of
series) the moment :class:`hetfed.runs.rundir.MetricsWriter` writes them, so the values in
TensorBoard and MLflow are the values in ``metrics.csv``. Each method row (FedMoE's views
included) is its own TensorBoard run and its own MLflow child run, so both tools overlay the
methods of a run on one chart; tags are ``eval/<metric>`` and ``train/<metric>`` in both.

A resumed run continues the same tracking runs without duplicated steps: TensorBoard hides
what was written after the checkpoint (``purge_step``, TensorBoard's own mechanism for a
restart), MLflow skips the steps it already holds (a resumed run recomputes exactly the values
it had). A tracker that fails mid-run is a warning and is dropped: tracking never loses a run.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from hetfed.errors import ConfigError
from hetfed.runs.rundir import CONFIG, FIGURES, METRICS, REPORT, SUMMARY

#: what ``tracking:`` may list, and the package each needs
TRACKERS: dict[str, tuple[str, str]] = {
    "tensorboard": ("tensorboard", "pip install 'hetfed[tracking]' (or: pip install tensorboard)"),
    "mlflow": ("mlflow", "pip install 'hetfed[tracking]' (or: pip install mlflow-skinny)"),
}
#: what leaves a row's split for a tag's prefix
SPLIT_TAG = {"summary": "eval", "train": "train"}
STATE_FILE = "tracking.json"
#: the heterogeneity figures a tracker logs once per run
HETEROGENEITY_KEYS = ("gamma", "gamma_iid", "gamma_excess", "gamma_given_label", "gamma_given_label_excess",
                      "label_emd_mean", "js_mean")


def check_trackers(kinds: Iterable[str]) -> None:
    """Refuse, before anything is written, a tracker whose package is not installed."""
    import importlib.util

    for kind in kinds:
        module, how = TRACKERS[kind]
        if importlib.util.find_spec(module) is None:
            raise ConfigError(f"tracking = {list(kinds)!r}: {kind!r} needs the {module} package, which is not "
                              f"installed; {how}")


def tag(split: str, metric: str) -> str:
    """The name a metric row gets in TensorBoard and MLflow: ``eval/global_accuracy``, ``train/loss``."""
    return f"{SPLIT_TAG.get(split, split)}/{metric}"


def kept_rounds(metrics_csv: Path) -> dict[str, int]:
    """Per method row, the last round ``metrics.csv`` holds (after a resume truncated it to its checkpoint)."""
    last: dict[str, int] = {}
    if not metrics_csv.is_file():
        return last
    with open(metrics_csv, newline="") as fh:
        for row in csv.DictReader(fh):
            if row["client"] == "all":
                last[row["method"]] = max(last.get(row["method"], -1), int(row["round"]))
    return last


def flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """A nested config as ``train.optimizer.lr``-style keys (list items by index), values as text."""
    if isinstance(value, dict):
        out: dict[str, str] = {}
        for k, v in value.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    if isinstance(value, list) and value and any(isinstance(v, dict | list) for v in value):
        out = {}
        for i, v in enumerate(value):
            out.update(flatten(v, f"{prefix}{i}."))
        return out
    return {prefix.rstrip("."): json.dumps(value) if isinstance(value, list) else str(value)}


def git_commit(where: Path | None = None) -> str | None:
    """The commit checked out where the run was started (the user's project), if it is a git work tree."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=where or Path.cwd(), capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def summary_table(summary: dict[str, Any]) -> str:
    """The run's final table as Markdown (TensorBoard's text plugin renders it)."""
    metrics = ("local_accuracy_mean", "local_accuracy_weighted", "global_accuracy")
    lines = ["| method | best round | " + " | ".join(f"best {m}" for m in metrics) + " | final global_accuracy |",
             "|---" * (len(metrics) + 3) + "|"]

    def fmt(v: Any) -> str:
        return "-" if not isinstance(v, int | float) else f"{v:.4f}"

    for label, m in summary.get("methods", {}).items():
        best, final = m.get("best", {}), m.get("final", {})
        lines.append(f"| {label} | {m.get('best_round', '-')} | " + " | ".join(fmt(best.get(k)) for k in metrics)
                     + f" | {fmt(final.get('global_accuracy'))} |")
    return "\n".join(lines)


class TensorBoardTracker:
    """``RUN/tb/``: the run's own scalars and text at the top, one sub-directory (a TensorBoard run) per method row."""

    def __init__(self, run_dir: Path, config_yaml: str, heterogeneity: dict[str, Any], kept: dict[str, int] | None):
        from torch.utils.tensorboard import SummaryWriter

        self._SummaryWriter = SummaryWriter
        self.root = run_dir / "tb"
        self._writers: dict[str, Any] = {}
        self._purge: dict[str, int] = {}
        if kept is not None and self.root.is_dir():  # resumed: continue each method's run where its rows end
            for sub in self.root.iterdir():
                if not sub.is_dir():
                    continue
                label = unquote(sub.name)
                if label in kept:
                    self._purge[label] = kept[label] + 1  # TensorBoard hides its steps ≥ this from the old run
                else:
                    shutil.rmtree(sub)  # started after the checkpoint: it starts again from its first round
            self.top = SummaryWriter(str(self.root))
            return
        self.top = SummaryWriter(str(self.root))
        self.top.add_text("config", "\n".join("    " + line for line in config_yaml.splitlines()), 0)
        for key in HETEROGENEITY_KEYS:
            value = heterogeneity.get(key)
            if isinstance(value, int | float):
                self.top.add_scalar(f"heterogeneity/{key}", float(value), 0)
        self.top.flush()

    def _writer(self, method: str) -> Any:
        if method not in self._writers:
            path = str(self.root / quote(method, safe=""))
            self._writers[method] = self._SummaryWriter(path, purge_step=self._purge.get(method))
        return self._writers[method]

    def log(self, method: str, rnd: int, split: str, metrics: dict[str, float]) -> None:
        writer = self._writer(method)
        for metric, value in metrics.items():
            writer.add_scalar(tag(split, metric), float(value), rnd)

    def flush(self) -> None:
        for writer in (self.top, *self._writers.values()):
            writer.flush()

    def finish(self, run_dir: Path, summary: dict[str, Any] | None, status: str) -> None:
        if summary is not None:
            self.top.add_text("summary/table", summary_table(summary), 0)
        for png in sorted((run_dir / FIGURES).glob("*.png")) if summary is not None else []:
            from matplotlib.image import imread

            image = imread(png)[..., :3]  # RGB: drop the alpha channel
            self.top.add_image(f"figures/{png.stem}", image, 0, dataformats="HWC")
        for writer in (self.top, *self._writers.values()):
            writer.close()


class MLflowTracker:
    """One MLflow run per hetfed run (params, Γ, artefacts) with a child run per method row (its metrics).

    The store is ``MLFLOW_TRACKING_URI`` when set, else a SQLite file ``mlflow.db`` in ``root`` (the
    run directory, or the sweep's directory so that a sweep's runs share one store); artefacts go
    to ``root/mlartifacts``. The ids are kept in ``RUN/tracking.json`` for a resume.
    """

    def __init__(self, run_dir: Path, config: Any, heterogeneity: dict[str, Any], root: Path, resumed: bool,
                 tags: dict[str, str]):
        import logging

        from mlflow import MlflowClient

        for noisy in ("mlflow.store.db.utils", "alembic"):  # "Creating initial MLflow database tables…" per store
            logging.getLogger(noisy).setLevel(logging.WARNING)
        self.run_dir = run_dir
        state_path = run_dir / STATE_FILE
        state = json.loads(state_path.read_text()).get("mlflow") if resumed and state_path.is_file() else None
        env_uri = os.environ.get("MLFLOW_TRACKING_URI")
        self.uri = state["uri"] if state else (env_uri or f"sqlite:///{(root / 'mlflow.db').resolve()}")
        self.client = MlflowClient(tracking_uri=self.uri)
        self._methods = {m.label: m for m in config.methods}
        self._seed = config.seed
        self._pending: list[Any] = []
        self._skip: dict[tuple[str, str], int] = {}  # (child run, key) → last step it already holds
        if state:
            self.experiment_id, self.parent = state["experiment_id"], state["parent"]
            self.children: dict[str, str] = dict(state["children"])
            self.client.update_run(self.parent, status="RUNNING")
            for child in self.children.values():
                self.client.update_run(child, status="RUNNING")
                for key in self.client.get_run(child).data.metrics:
                    steps = [m.step for m in self.client.get_metric_history(child, key)]
                    self._skip[(child, key)] = max(steps, default=-1)
            return
        self.experiment_id = self._experiment(config.name, None if env_uri else (root / "mlartifacts"))
        commit = git_commit()
        run_tags = {"hetfed.seed": str(config.seed), "hetfed.run_dir": str(run_dir.resolve()),
                    "hetfed.methods": ",".join(m.label for m in config.methods), **tags,
                    **({"mlflow.source.git.commit": commit} if commit else {})}
        self.parent = self.client.create_run(self.experiment_id, run_name=tags.get("hetfed.run_name", run_dir.name),
                                             tags=run_tags).info.run_id
        self.children = {}
        self._save_state()
        from mlflow.entities import Metric, Param

        params = [Param(k[:250], v[:6000]) for k, v in flatten(config.model_dump(mode="json")).items()]
        for i in range(0, len(params), 100):  # log_batch takes at most 100 params
            self.client.log_batch(self.parent, params=params[i:i + 100])
        now = int(time.time() * 1000)
        het = [Metric(f"heterogeneity/{k}", float(heterogeneity[k]), now, 0)
               for k in HETEROGENEITY_KEYS
               if isinstance(heterogeneity.get(k), int | float)]
        if het:
            self.client.log_batch(self.parent, metrics=het)

    def _experiment(self, name: str, artifacts: Path | None) -> str:
        from mlflow.exceptions import MlflowException

        found = self.client.get_experiment_by_name(name)
        if found is not None:
            return found.experiment_id
        try:
            return self.client.create_experiment(name, artifact_location=artifacts.resolve().as_uri()
                                                 if artifacts else None)
        except MlflowException:  # a sweep's other worker created it in between
            found = self.client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    def _save_state(self) -> None:
        from hetfed.runs.rundir import write_json_atomic

        write_json_atomic(self.run_dir / STATE_FILE, {"mlflow": {
            "uri": self.uri, "experiment_id": self.experiment_id, "parent": self.parent, "children": self.children}})

    def _child(self, label: str) -> str:
        if label not in self.children:
            method = self._methods.get(label) or self._methods.get(label.split(":")[0])
            tags = {"mlflow.parentRunId": self.parent, "hetfed.method": label, "hetfed.seed": str(self._seed)}
            if method is not None:
                tags["hetfed.algorithm"] = method.algorithm
            run = self.client.create_run(self.experiment_id, run_name=label, tags=tags)
            self.children[label] = run.info.run_id
            if method is not None:
                from mlflow.entities import Param

                params = [Param("algorithm", method.algorithm)] + [
                    Param(f"params.{k}"[:250], v[:6000]) for k, v in flatten(method.params or {}).items()]
                self.client.log_batch(run.info.run_id, params=params[:100])
            self._save_state()
        return self.children[label]

    def log(self, method: str, rnd: int, split: str, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric

        child = self._child(method)
        now = int(time.time() * 1000)
        for metric, value in metrics.items():
            key = tag(split, metric)
            if rnd <= self._skip.get((child, key), -1):
                continue  # logged before the interruption; the resumed run recomputed the same value
            self._pending.append((child, Metric(key, float(value), now, int(rnd))))

    def flush(self) -> None:
        by_run: dict[str, list[Any]] = {}
        for child, metric in self._pending:
            by_run.setdefault(child, []).append(metric)
        self._pending = []
        for run_id, metrics in by_run.items():
            for i in range(0, len(metrics), 1000):  # log_batch takes at most 1000 metrics
                self.client.log_batch(run_id, metrics=metrics[i:i + 1000])

    def finish(self, run_dir: Path, summary: dict[str, Any] | None, status: str) -> None:
        self.flush()
        if summary is not None:
            from mlflow.entities import Metric

            now = int(time.time() * 1000)
            for label, m in summary.get("methods", {}).items():
                child = self._child(label)
                metrics = [Metric(f"{which}/{k}", float(v), now, 0) for which in ("best", "final")
                           for k, v in (m.get(which) or {}).items() if isinstance(v, int | float)]
                for i in range(0, len(metrics), 1000):
                    self.client.log_batch(child, metrics=metrics[i:i + 1000])
            for name in (SUMMARY, CONFIG, METRICS, REPORT):
                if (run_dir / name).is_file():
                    self.client.log_artifact(self.parent, str(run_dir / name))
            if (run_dir / FIGURES).is_dir():
                self.client.log_artifacts(self.parent, str(run_dir / FIGURES), artifact_path="figures")
        final = "FINISHED" if status == "complete" else "FAILED"
        for run_id in (*self.children.values(), self.parent):
            self.client.set_terminated(run_id, status=final)


class Trackers:
    """The run's trackers as one: each call goes to every tracker; one that fails warns once and is dropped."""

    def __init__(self, trackers: dict[str, Any], warn: Callable[[str], None]):
        self.trackers, self.warn = trackers, warn

    def _each(self, call: Callable[[Any], None]) -> None:
        for kind, tracker in list(self.trackers.items()):
            try:
                call(tracker)
            except Exception as err:  # tracking must never lose a run
                del self.trackers[kind]
                self.warn(f"warning: {kind} tracking stopped: {type(err).__name__}: {err} (metrics.csv has "
                          "everything; the run goes on)")

    def log(self, method: str, rnd: int, split: str, metrics: dict[str, float]) -> None:
        self._each(lambda t: t.log(method, rnd, split, metrics))

    def flush(self) -> None:
        self._each(lambda t: t.flush())

    def finish(self, run_dir: Path, summary: dict[str, Any] | None, status: str) -> None:
        self._each(lambda t: t.finish(run_dir, summary, status))


def open_trackers(config: Any, run_dir: Path, heterogeneity: dict[str, Any], *, resumed: bool, root: Path | None = None,
                  tags: dict[str, str] | None = None, warn: Callable[[str], None] = print) -> Trackers | None:
    """The trackers ``config.tracking`` names, opened on ``run_dir`` (None when it names none).

    ``root``: where MLflow's default store lives (the sweep's directory for a sweep's runs);
    ``tags``: extra MLflow tags (a sweep's name and point).
    """
    if not config.tracking:
        return None
    from hetfed.config import dump_config

    kept = kept_rounds(run_dir / METRICS) if resumed else None
    trackers: dict[str, Any] = {}
    for kind in dict.fromkeys(config.tracking):
        try:
            if kind == "tensorboard":
                trackers[kind] = TensorBoardTracker(run_dir, dump_config(config), heterogeneity, kept)
            else:
                trackers[kind] = MLflowTracker(run_dir, config, heterogeneity, root or run_dir, resumed, tags or {})
        except Exception as err:
            warn(f"warning: {kind} tracking not started: {type(err).__name__}: {err} (the run goes on)")
    return Trackers(trackers, warn)
