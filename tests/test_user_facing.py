"""What a new user meets: wrong data never silently used, failures said in one line,
runs that say what they did. Each test here failed on the code before issue #10."""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hetfed.cli import main
from hetfed.data.formats import write_idx

REPO = Path(__file__).resolve().parents[1]
FAST = ["--set", "train.rounds=2"]


def run_cli(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code: int, err: str, *needles: str) -> str:
    """The README's promise: exit 2 and one line that names what is wrong."""
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def write_mnist_like(folder: Path, n_train: int = 120, n_test: int = 40, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        y = np.arange(n) % 10
        x = (rng.random((n, 8, 8)) * 60 + y[:, None, None] * 19).astype(np.uint8)
        write_idx(folder / f"{prefix}-images-idx3-ubyte.gz", x)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte.gz", y.astype(np.uint8))


# ------------------------------------------------------------- wrong data, wrong results


def test_a_data_dir_that_does_not_exist_is_an_error_not_a_fallback(tmp_path, capsys):
    code, _, err = run_cli(["run", "--set", "dataset.name=fashion-mnist", "--set", "dataset.data_dir=/does/not/exist",
                            "--out", str(tmp_path / "r")], capsys)
    assert_one_line_error(code, err, "dataset.data_dir = '/does/not/exist'")
    assert not (tmp_path / "r").exists()


def test_a_data_dir_missing_a_file_names_the_file(tmp_path, capsys):
    write_mnist_like(tmp_path / "data")
    (tmp_path / "data" / "train-images-idx3-ubyte.gz").unlink()
    code, _, err = run_cli(["partition", "--set", "dataset.name=fashion-mnist",
                            "--set", f"dataset.data_dir={tmp_path / 'data'}"], capsys)
    assert_one_line_error(code, err, "train-images-idx3-ubyte", "dataset.data_dir")


def test_the_run_records_which_files_it_read(tmp_path, capsys):
    write_mnist_like(tmp_path / "data")
    code, _, err = run_cli(["run", *FAST, "--set", "dataset.name=mnist", "--set",
                            f"dataset.data_dir={tmp_path / 'data'}",
                            "--set", "partition.kind=iid", "--set", "partition.clients=4", "--quiet",
                            "--out", str(tmp_path / "r")], capsys)
    assert code == 0, err
    files = json.loads((tmp_path / "r" / "summary.json").read_text())["data_files"]
    assert len(files) == 4
    for f in files:
        assert Path(f["path"]).parent == (tmp_path / "data").resolve()
        assert f["sha256"] == hashlib.sha256(Path(f["path"]).read_bytes()).hexdigest()
    # the default dataset's file is recorded too
    code, out, _ = run_cli(["partition", "--json"], capsys)
    assert json.loads(out)["data_files"][0]["path"].endswith("digits.csv.gz")


def test_a_diverged_run_fails_instead_of_reporting_success(tmp_path, capsys):
    """lr = 1e38: the first step overflows float32 whatever the batch order (1e6 diverged under the old streams and
    only by luck: under the counter-based ones its ReLUs die first and the losses stay finite)."""
    run = tmp_path / "r"
    code, _, err = run_cli(["run", "--set", "train.optimizer.lr=1e38", "--set", "train.rounds=20", "--out", str(run)],
                           capsys)
    assert_one_line_error(code, err, "diverged", "train.optimizer.lr")
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "failed" and "diverged" in status["reason"]
    assert not (run / "summary.json").exists()


def test_a_nan_validation_loss_is_never_the_best_model():
    """Best-model selection: a NaN loss (diverged, or no data) must not count as an improvement."""
    from hetfed.algorithms import build_algorithm
    from hetfed.config import TrainConfig, build_config
    from hetfed.executors import updates as sim
    from hetfed.executors.simulate import simulate
    from hetfed.models import build_model
    from hetfed.pipeline import prepare

    prep = prepare(build_config({"partition": {"clients": 4}}), progress=False)
    train = TrainConfig(rounds=4, local_steps=2)
    model = build_model(build_config({}).model, prep.federation.input_shape, prep.federation.n_classes)
    algo = build_algorithm("fedavg", model, train)
    real = sim.evaluation_steps
    calls = {"n": 0}

    def nan_at_round_3(*a, **k):
        ev = yield from real(*a, **k)
        calls["n"] += 1
        if calls["n"] == 3:
            ev.metrics["val_loss"] = float("nan")
        return ev

    sim.evaluation_steps = nan_at_round_3
    try:
        with pytest.raises(sim.DivergedError, match="round 3"):
            simulate(algo, prep.federation, train, 0)
    finally:
        sim.evaluation_steps = real


def test_without_validation_data_the_summary_says_there_was_nothing_to_select_on(tmp_path, capsys):
    code, out, err = run_cli(["run", *FAST, "--set", "partition.val_fraction=0", "--out", str(tmp_path / "r")], capsys)
    assert code == 0, err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    for m in summary["methods"].values():
        assert m["selected_by"] is None and "nothing to select on" in m["selection_note"]
        assert m["best"] == m["final"]
    assert any("validation" in w for w in summary["warnings"])
    assert "warning:" in err and "nothing to select on" in out
    # with validation data the summary says what chose the best model
    code, _, _ = run_cli(["run", *FAST, "--quiet", "--out", str(tmp_path / "v")], capsys)
    assert all(
        m["selected_by"] == "val_loss"
        for m in json.loads((tmp_path / "v" / "summary.json").read_text())["methods"].values()
    )


def test_one_sample_clients_are_warned_about(tmp_path, capsys):
    code, out, err = run_cli(["partition", "--set", "partition.kind=iid", "--set", "partition.clients=700",
                              "--json"], capsys)
    assert code == 0, err
    warnings = json.loads(out)["warnings"]
    assert any("no test data" in w for w in warnings) and any("validation" in w for w in warnings)
    assert "warning:" in err


def test_clients_per_round_above_the_opted_in_clients_is_an_error_before_any_file(tmp_path, capsys):
    code, _, err = run_cli(["run", "--set", "train.clients_per_round=8", "--set", "partition.opt_out=0.5",
                            "--out", str(tmp_path / "r")], capsys)
    assert_one_line_error(code, err, "train.clients_per_round = 8", "only 5")
    assert not (tmp_path / "r").exists()


def test_everyone_opting_out_is_refused_once_and_before_the_run_directory(tmp_path, capsys):
    code, _, err = run_cli(["run", "--set", "partition.opt_out=1.0", "--out", str(tmp_path / "r")], capsys)
    line = assert_one_line_error(code, err, "partition.opt_out = 1.0")
    assert err.count(line.split(":", 1)[1].strip()[:40]) == 1
    assert not (tmp_path / "r").exists()


def _npz(path: Path, **arrays) -> Path:
    np.savez(path, **arrays)
    return path


def _arrays_args(path: Path) -> list[str]:
    return ["partition", "--set", "dataset.name=arrays", "--set", f"dataset.path={path}",
            "--set", "partition.kind=iid", "--set", "partition.clients=2", "--json"]


def test_a_single_class_dataset_is_refused(tmp_path, capsys):
    x = np.random.default_rng(0).normal(size=(60, 3))
    path = _npz(tmp_path / "one.npz", x=x, y=np.zeros(60, dtype=int), split=np.array(["train"] * 50 + ["test"] * 10))
    code, _, err = run_cli(_arrays_args(path), capsys)
    assert_one_line_error(code, err, "single class")


def test_whole_number_float_labels_are_accepted_and_fractional_ones_refused(tmp_path, capsys):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(80, 3))
    y = (np.arange(80) % 2).astype(float)
    code, out, err = run_cli(_arrays_args(_npz(tmp_path / "f.npz", x=x, y=y)), capsys)
    assert code == 0, err
    assert json.loads(out)["n_classes"] == 2
    code, _, err = run_cli(_arrays_args(_npz(tmp_path / "g.npz", x=x, y=y + 0.5)), capsys)
    assert_one_line_error(code, err, "whole numbers")


# ------------------------------------------------------------------------ config files


@pytest.mark.parametrize(("content", "needle"), [
    (b"", "is empty"),
    (b"# only a comment\n", "is empty"),
    (b"seed: 1\nseed: 2\n", "'seed' appears twice"),
    (b"train:\n  rounds: 3\n  rounds: 4\n", "'rounds' appears twice"),
    (b"seed: 1\nname: caf\xe9\n", "not UTF-8"),
    (b"seed: [1, 2\n", "not valid YAML"),
])
def test_bad_config_files_get_one_line(tmp_path, capsys, content, needle):
    path = tmp_path / "c.yaml"
    path.write_bytes(content)
    code, _, err = run_cli(["config", str(path)], capsys)
    assert_one_line_error(code, err, needle)


def test_a_directory_given_as_the_config_is_called_a_directory(tmp_path, capsys):
    code, _, err = run_cli(["run", str(tmp_path)], capsys)
    assert_one_line_error(code, err, "is a directory")


# ------------------------------------------------------------------- bad data files


def _write_bad(tmp_path: Path, kind: str) -> Path:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(100, 4)), np.arange(100) % 2
    p = tmp_path / "d.npz"
    if kind == "nan":
        x[3, 1] = np.nan
        np.savez(p, x=x, y=y)
    elif kind == "inf":
        x[5, 0] = np.inf
        np.savez(p, x=x, y=y)
    elif kind == "huge":
        x[7, 2] = 1e300
        np.savez(p, x=x, y=y)
    elif kind == "truncated":
        np.savez(p, x=x, y=y)
        p.write_bytes(p.read_bytes()[:300])
    elif kind == "empty":
        np.savez(p, x=np.zeros((0, 4)), y=np.zeros(0, dtype=int))
    elif kind == "five":
        np.savez(p, x=x[:5], y=y[:5])
    elif kind == "strings2d":
        np.savez(p, x=np.array([["a", "b"]] * 100), y=y)
    elif kind == "text":
        p.write_text("x,y\n1,2\n")
    return p


@pytest.mark.parametrize(("kind", "needle"), [
    ("nan", "NaN or infinite"), ("inf", "NaN or infinite"), ("huge", "standardise"),
    ("truncated", "corrupt or truncated"), ("empty", "too few"), ("five", "too few"),
    ("strings2d", "strings"), ("text", "is a text file"),
])
def test_bad_arrays_files_get_one_line(tmp_path, capsys, kind, needle):
    code, _, err = run_cli(_arrays_args(_write_bad(tmp_path, kind)), capsys)
    assert_one_line_error(code, err, needle)


def test_a_corrupt_gzip_idx_file_gets_one_line(tmp_path, capsys):
    write_mnist_like(tmp_path / "data")
    target = tmp_path / "data" / "train-images-idx3-ubyte.gz"
    raw = bytearray(target.read_bytes())
    start = raw.index(b"\x00", 10) + 1  # after the gzip header and its file name: the deflate stream
    raw[start + 2 : start + 10] = b"\xff" * 8  # zlib.error, not a CRC mismatch
    target.write_bytes(bytes(raw))
    code, _, err = run_cli(["partition", "--set", "dataset.name=mnist", "--set",
                            f"dataset.data_dir={tmp_path / 'data'}"], capsys)
    assert_one_line_error(code, err, "train-images-idx3-ubyte.gz")


def test_string_texts_in_an_npz_are_text_and_the_install_hint_keeps_its_extra(tmp_path, capsys):
    texts = np.array([f"text number {i}" for i in range(60)])
    path = _npz(tmp_path / "t.npz", x=texts, y=np.arange(60) % 2)
    code, _, err = run_cli(_arrays_args(path), capsys)
    assert_one_line_error(code, err, "pip install 'hetfed[text]'")


def test_user_values_are_printed_as_written_not_as_markup(capsys):
    code, _, err = run_cli(["config", "--set", "dataset.name=[b]x"], capsys)
    assert_one_line_error(code, err, "'[b]x'")


def test_an_unwritable_out_gets_one_line(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    code, _, err = run_cli(["run", *FAST, "--out", str(blocker / "r")], capsys)
    assert_one_line_error(code, err, "--out", "cannot be created for the run", "choose another --out")


def test_an_unknown_plot_format_is_refused_before_any_work(tmp_path, capsys):
    code, _, err = run_cli(["partition", "--plot", str(tmp_path / "clients.xyz")], capsys)
    assert_one_line_error(code, err, "--plot", ".png")
    assert "loading" not in err


# ---------------------------------------------------------------------------- sweeps


@pytest.mark.parametrize("values,config", [("[32],[64]", []),  # no config: the built-in experiment, as `hetfed run`
                                           ("[32,32],[64,64]", [str(REPO / "configs" / "default.yaml")])])
def test_sweeps_over_list_values_complete(tmp_path, capsys, values, config):
    out = tmp_path / "s"
    code, _, err = run_cli(["sweep", *config, *FAST, "--grid", f"model.hidden={values}",
                            "--seeds", "1", "--out", str(out), "--quiet"], capsys)
    assert code == 0, err
    with open(out / "sweep.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert {r["model.hidden"] for r in rows} == {v for v in (values.replace("],[", "]|[").split("|"))}
    assert len(json.loads((out / "sweep.json").read_text())["runs"]) == 2
    with open(out / "heterogeneity.csv") as fh:  # Γ, its size-matched IID reference and the excess
        assert {"gamma", "gamma_iid", "gamma_excess"} <= {r["metric"] for r in csv.DictReader(fh)}


def test_a_failure_while_aggregating_keeps_the_runs_listed(tmp_path, capsys, monkeypatch):
    from hetfed.runs import sweep

    def broken(*a, **k):
        raise TypeError("boom")

    monkeypatch.setattr(sweep, "aggregate", broken)
    out = tmp_path / "s"
    code, _, err = run_cli(["sweep", str(REPO / "configs" / "default.yaml"), *FAST, "--grid", "partition.shuffle=0,1",
                            "--seeds", "1", "--out", str(out), "--quiet"], capsys)
    assert_one_line_error(code, err, "aggregating the sweep failed")
    record = json.loads((out / "sweep.json").read_text())
    assert len(record["runs"]) == 2 and "boom" in record["aggregation_error"]
    assert all((Path(r["run_dir"]) / "summary.json").is_file() for r in record["runs"])


def test_resuming_a_sweep_with_a_changed_config_is_refused_and_keeps_the_runs(tmp_path, capsys):
    out = tmp_path / "s"
    base = ["sweep", str(REPO / "configs" / "default.yaml"), *FAST, "--grid", "partition.shuffle=0,1", "--seeds", "1",
            "--out", str(out), "--quiet"]
    assert run_cli(base, capsys)[0] == 0
    before = sorted(p.name for p in out.iterdir())
    code, _, err = run_cli([*base, "--resume", "--set", "train.optimizer.lr=0.05"], capsys)
    assert_one_line_error(code, err, "different config", "train.optimizer.lr")
    assert sorted(p.name for p in out.iterdir()) == before
    assert not list(out.rglob("*.incomplete-*"))
    assert run_cli([*base, "--resume"], capsys)[0] == 0  # the same config resumes (reuses every run)


#: what no run can have on this machine: CUDA on a CPU-only one; on a GPU machine, CUDA with the CPU's recorder
UNAVAILABLE = ["train.device=cuda", *(["train.capture=compile"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("sets", [
    [a for s in UNAVAILABLE for a in ("--set", s)],
    ["--grid", "train.device=cpu,cuda", *(["--set", "train.capture=compile"] if torch.cuda.is_available() else [])],
])
def test_a_sweep_whose_runs_would_fail_on_this_machines_device_is_refused_before_its_directory(tmp_path, capsys, sets):
    """`hetfed sweep --set train.device=cuda` on a machine with no GPU: the one-line error `hetfed run` gives, exit 2,
    and no sweep directory (it wrote one, ran every run into the same failure, and said only "every run failed")."""
    out = tmp_path / "s"
    code, _, err = run_cli(["sweep", *FAST, *sets, "--seeds", "2", "--out", str(out), "--quiet"], capsys)
    assert_one_line_error(code, err, "train.device = 'cuda'")
    assert not out.exists()


# ------------------------------------------------------------------- signals and logs


def _spawn(args: list[str], out: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "hetfed.cli", *args], stdout=open(out, "w"),  # noqa: SIM115
                            stderr=subprocess.STDOUT, env=env)


def _wait_for_status(run: Path, proc: subprocess.Popen, timeout: float = 60) -> dict:
    t0 = time.time()
    while time.time() - t0 < timeout:
        try:
            status = json.loads((run / "status.json").read_text())
            if status.get("status") == "running" and (run / "metrics.csv").stat().st_size > 100:
                return status
        except (OSError, ValueError):
            pass
        assert proc.poll() is None, "the run ended before it could be signalled"
        time.sleep(0.1)
    raise AssertionError("the run never reported running")


@pytest.mark.slow
def test_sigterm_marks_the_run_failed_and_sigkill_leaves_a_run_known_dead(tmp_path):
    from hetfed.runs.rundir import run_state

    run = tmp_path / "r"
    proc = _spawn(["run", "--set", "train.rounds=100000", "--out", str(run)], tmp_path / "log")
    try:
        status = _wait_for_status(run, proc)
        assert status["pid"] == proc.pid and "heartbeat" in status
        assert run_state(run) == "running"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        proc.kill()
    status = json.loads((run / "status.json").read_text())
    assert status["status"] == "failed" and "SIGTERM" in status["reason"]

    run2 = tmp_path / "r2"
    proc = _spawn(["run", "--set", "train.rounds=100000", "--out", str(run2)], tmp_path / "log2")
    try:
        _wait_for_status(run2, proc)
        proc.kill()
        proc.wait(timeout=30)
    finally:
        proc.kill()
    assert json.loads((run2 / "status.json").read_text())["status"] == "running"  # nobody could say otherwise
    assert run_state(run2) == "dead"


@pytest.mark.slow
def test_progress_reaches_a_log_file_while_running_and_tables_are_not_cut(tmp_path):
    log = tmp_path / "log"
    proc = _spawn(["run", "--set", "train.rounds=30", "--out", str(tmp_path / "r")], log)
    assert proc.wait(timeout=300) == 0
    text = log.read_text()
    assert "loading digits" in text and "partitioning" in text and "relu: rounds 30/30" in text
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.split()[:1] == ["method"])  # the header's second line
    assert "acc" in lines[at] and "round" in lines[at] and "ms/" in lines[at - 1]
    assert not any("…" in ln for ln in lines[at - 1:at + 5])


def test_fedmoe_phases_show_progress_in_logs(tmp_path):
    log = tmp_path / "log"
    proc = _spawn(["run", str(REPO / "configs" / "fedmoe_digits.yaml"), "--set", "train.rounds=2",
                   "--set", "methods.0.params.max_epochs=2", "--out", str(tmp_path / "r")], log)
    assert proc.wait(timeout=300) == 0
    text = log.read_text()
    assert "fedavg: rounds 2/2" in text  # the federated phase
    assert "fedmoe:personalise: clients 20/20" in text, text  # Local, Fine-tuned and Mixture, client by client


def test_quiet_still_says_where_the_results_are(tmp_path, capsys):
    code, out, _ = run_cli(["run", *FAST, "--quiet", "--out", str(tmp_path / "r")], capsys)
    assert code == 0 and out.strip() == f"run directory: {tmp_path / 'r'}"


def test_every_file_of_a_run_has_the_same_permissions(tmp_path, capsys):
    assert run_cli(["run", *FAST, "--quiet", "--out", str(tmp_path / "r")], capsys)[0] == 0
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (tmp_path / "r").iterdir() if p.is_file()}
    assert len(set(modes.values())) == 1, modes


@pytest.mark.slow
def test_the_readme_test_command_prints_how_many_passed(tmp_path):
    (tmp_path / "test_one.py").write_text("def test_ok():\n    assert True\n")
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-c", str(REPO / "pyproject.toml"), "--rootdir",
                          str(tmp_path), str(tmp_path / "test_one.py")], capture_output=True, text=True, cwd=tmp_path)
    assert "1 passed" in out.stdout, out.stdout


def test_ci_runs_the_readmes_test_command_and_then_the_tests_it_leaves_out():
    """The README's test command leaves out the tests marked slow; CI must run both, or a slow test's failure would
    never be seen (and the README must say how to run them)."""
    import re

    readme = (REPO / "README.md").read_text()
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    command = next(b for b in blocks if "pytest" in b).split("&& ")[-1].strip()
    assert command == 'python -m pytest -q -m "not slow"', command
    ci = [ln.strip() for ln in (REPO / ".ci" / "run").read_text().splitlines() if "pytest" in ln and
          not ln.lstrip().startswith("#")]
    assert ci == [command, "python -m pytest -q -m slow"], ci
    assert "`python -m pytest -q -m slow`" in readme


def test_the_package_docstring_names_only_files_that_exist():
    import re

    import hetfed

    for name in re.findall(r"``([\w/.-]+\.md)``|([A-Z]+\.md)", hetfed.__doc__):
        path = next(n for n in name if n)
        assert (REPO / path).is_file() or (REPO / "docs" / path).is_file(), path


def test_gz_reader_is_the_one_the_loader_uses(tmp_path):
    """write_idx writes real gzip: the corrupt-file test corrupts a real format."""
    write_mnist_like(tmp_path / "d", n_train=10, n_test=10)
    with gzip.open(tmp_path / "d" / "train-labels-idx1-ubyte.gz") as fh:
        assert fh.read(4) == b"\x00\x00\x08\x01"
