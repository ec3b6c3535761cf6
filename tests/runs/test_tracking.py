"""Experiment tracking (#27): what TensorBoard and MLflow hold is what metrics.csv holds, a resumed run
continues the same tracking runs without a duplicated step, and a missing or failing tracker never loses
a run. Everything is read back with the tools' own readers (EventAccumulator, MlflowClient)."""

from __future__ import annotations

import csv
import json
import math
from collections import defaultdict
from pathlib import Path

import pytest

from hetfed.cli import main
from tests.runs.test_resume import _kill_when, _start

SMALL = ["--set", "train.rounds=4", "--set", "train.eval_every=2",
         "--set", "methods=[{name: relu, algorithm: fedavg}, {name: cgau, algorithm: fedavg, model: {kind: cgau}}]"]
BOTH = ["--set", "tracking=[tensorboard,mlflow]"]


def csv_series(run: Path) -> dict[tuple[str, str], list[tuple[int, float]]]:
    """metrics.csv's round-level rows as (method, tag) → [(round, value)] — the reference."""
    out: dict[tuple[str, str], list[tuple[int, float]]] = defaultdict(list)
    with open(run / "metrics.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            if row["client"] == "all":
                prefix = {"summary": "eval", "train": "train"}[row["split"]]
                out[(row["method"], f"{prefix}/{row['metric']}")].append((int(row["round"]), float(row["value"])))
    return dict(out)


def tensorboard_series(run: Path) -> dict[tuple[str, str], list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = {}
    for sub in sorted(p for p in (run / "tb").iterdir() if p.is_dir()):
        acc = EventAccumulator(str(sub), size_guidance={"scalars": 0})
        acc.Reload()
        for name in acc.Tags()["scalars"]:
            out[(sub.name, name)] = [(e.step, e.value) for e in acc.Scalars(name)]
    return out


def mlflow_series(run: Path) -> dict[tuple[str, str], list[tuple[int, float]]]:
    from mlflow import MlflowClient

    state = json.loads((run / "tracking.json").read_text())["mlflow"]
    client = MlflowClient(state["uri"])
    out = {}
    for label, run_id in state["children"].items():
        for key in client.get_run(run_id).data.metrics:
            if key.split("/")[0] in ("eval", "train"):
                out[(label, key)] = sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))
    return out


def same(a: float, b: float, rel: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rel, abs_tol=rel)


def assert_round_trip(run: Path) -> None:
    ref = csv_series(run)
    for reader, rel in ((tensorboard_series, 1e-6), (mlflow_series, 0.0)):  # TensorBoard keeps float32
        got = reader(run)
        assert set(got) == set(ref), (reader.__name__, set(got) ^ set(ref))
        for key, rows in ref.items():
            steps = [s for s, _ in got[key]]
            assert steps == sorted(set(steps)), (reader.__name__, key, "a step logged twice")
            assert [s for s, _ in rows] == steps, (reader.__name__, key)
            assert all(same(a, b, rel) for (_, a), (_, b) in zip(rows, got[key], strict=True)), (reader.__name__, key)


@pytest.mark.draws
def test_tracked_values_equal_metrics_csv_and_the_run_is_described(tmp_path):
    from mlflow import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    assert main(["run", "--quiet", *SMALL, *BOTH, "--out", str(run)]) == 0
    assert_round_trip(run)
    assert ("relu", "eval/global_accuracy") in csv_series(run)

    summary = json.loads((run / "summary.json").read_text())
    top = EventAccumulator(str(run / "tb"), size_guidance={"images": 0, "scalars": 0, "tensors": 0})
    top.Reload()
    tags = top.Tags()
    assert top.Scalars("heterogeneity/gamma")[0].value == pytest.approx(summary["gamma"], rel=1e-6)
    assert top.Scalars("heterogeneity/gamma_excess")[0].value == pytest.approx(
        summary["heterogeneity"]["gamma_excess"], rel=1e-6)
    assert {"figures/learning_curves", "figures/clients"} <= set(tags["images"])
    text = {name: top.Tensors(name)[0].tensor_proto.string_val[0].decode() for name in tags["tensors"]}
    assert "global_accuracy" in text["summary/table/text_summary"] and "relu" in text["summary/table/text_summary"]
    assert "tracking:" in text["config/text_summary"]

    state = json.loads((run / "tracking.json").read_text())["mlflow"]
    assert state["uri"] == f"sqlite:///{(run / 'mlflow.db').resolve()}"
    client = MlflowClient(state["uri"])
    parent = client.get_run(state["parent"])
    assert parent.info.status == "FINISHED"
    assert parent.data.params["train.rounds"] == "4" and parent.data.params["methods.1.model.kind"] == "cgau"
    assert parent.data.tags["hetfed.seed"] == "0"
    assert parent.data.metrics["heterogeneity/gamma"] == pytest.approx(summary["gamma"])
    assert {f.path for f in client.list_artifacts(state["parent"])} >= {
        "summary.json", "report.html", "figures", "config.yaml", "metrics.csv"}
    child = client.get_run(state["children"]["cgau"])
    assert child.data.tags["mlflow.parentRunId"] == state["parent"] and child.data.tags["hetfed.method"] == "cgau"
    assert child.data.metrics["best/global_accuracy"] == summary["methods"]["cgau"]["best"]["global_accuracy"]


def test_mlflow_tracking_uri_from_the_environment_is_used(tmp_path, monkeypatch):
    store = tmp_path / "store.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store}")
    monkeypatch.chdir(tmp_path)  # the store's own default: artefacts under ./mlruns, which must not land in the repo
    run = tmp_path / "run"
    assert main(["run", "--quiet", *SMALL, "--set", "tracking=[mlflow]", "--out", str(run)]) == 0
    assert store.is_file() and not (run / "mlflow.db").exists() and not (run / "tb").exists()
    assert json.loads((run / "tracking.json").read_text())["mlflow"]["uri"] == f"sqlite:///{store}"
    assert (tmp_path / "mlruns").is_dir()  # MLflow's default artefact root for a store given by URI


@pytest.mark.slow
def test_a_killed_and_resumed_run_continues_the_same_tracking_runs_without_duplicates(tmp_path):
    args = ["run", "--quiet", "--set", "train.rounds=8", "--set", "train.checkpoint_every=2",
            "--set", "train.eval_every=1", *SMALL[4:], *BOTH, "--out", str(tmp_path / "run")]
    run = tmp_path / "run"
    # killed after round 5 of the first method, then of the second (checkpoints at rounds 4): round 5 was
    # tracked before each kill and is tracked again by the resumed run
    for i, n in enumerate((6, 10)):
        progress = tmp_path / f"kill{i}.progress"
        assert _kill_when(_start(args, progress), progress,
                          lambda lines, n=n: sum(ln.startswith("train") for ln in lines) >= n)
        args = ["run", "--quiet", "--resume", str(run)]
    last = _start(args, tmp_path / "final.progress")
    assert last.wait() == 0, last.stderr.read()
    assert_round_trip(run)  # every step once, with the uninterrupted run's values (metrics.csv is checked for that)
    state = json.loads((run / "tracking.json").read_text())["mlflow"]
    from mlflow import MlflowClient

    client = MlflowClient(state["uri"])
    runs = client.search_runs([client.get_run(state["parent"]).info.experiment_id])
    assert len(runs) == 3  # the same parent and two children all along: a resume opens no new run
    assert all(r.info.status == "FINISHED" for r in runs)


def test_a_sweep_shares_one_mlflow_store_with_a_run_per_point(tmp_path):
    from mlflow import MlflowClient

    sweep = tmp_path / "sweep"
    default = str(Path(__file__).parents[2] / "configs" / "default.yaml")
    assert main(["sweep", "--quiet", default, *SMALL, "--set", "tracking=[mlflow]", "--seeds", "2",
                 "--grid", "partition.shuffle=0,1", "--out", str(sweep)]) == 0
    client = MlflowClient(f"sqlite:///{(sweep / 'mlflow.db').resolve()}")
    parents = [r for r in client.search_runs([client.get_experiment_by_name("default").experiment_id])
               if "mlflow.parentRunId" not in r.data.tags]
    assert sorted(r.data.tags["hetfed.run_name"] for r in parents) == [
        "partition.shuffle=0/seed=0", "partition.shuffle=0/seed=1", "partition.shuffle=1/seed=0",
        "partition.shuffle=1/seed=1"]
    assert {r.data.tags["hetfed.sweep"] for r in parents} == {"sweep"}
    assert not list(sweep.glob("*/*/mlflow.db"))


def test_a_tracker_that_is_not_installed_is_refused_before_anything_is_written(tmp_path, monkeypatch, capsys):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else real(name, *a))
    assert main(["run", "--quiet", *SMALL, "--set", "tracking=[mlflow]", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tracking" in err[0] and "mlflow" in err[0] and "pip install" in err[0]
    assert not (tmp_path / "run").exists()
    assert main(["run", "--quiet", "--set", "tracking=[wandb]", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "tracking" in err and "wandb" in err and "tensorboard" in err


def test_a_failing_tracker_warns_once_and_the_run_completes(tmp_path, monkeypatch, capsys):
    from hetfed.runs import tracking

    def broken(self, *a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(tracking.MLflowTracker, "log", broken)
    run = tmp_path / "run"
    assert main(["run", "--quiet", *SMALL, *BOTH, "--out", str(run)]) == 0
    err = capsys.readouterr().err
    assert err.count("mlflow tracking stopped") == 1 and "disk full" in err
    assert json.loads((run / "status.json").read_text())["status"] == "complete"
    assert set(tensorboard_series(run)) == set(csv_series(run))  # the other tracker went on
