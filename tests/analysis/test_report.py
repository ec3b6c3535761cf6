"""hetfed report and the figures: what a reader of the results relies on.

The report is checked the way a reader meets it: rendered by a real browser
(headless Chromium), every figure decoded, every table there.
"""

from __future__ import annotations

import csv
import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from hetfed.analysis.present import present_run, present_sweep
from hetfed.cli import main
from hetfed.config import build_config
from hetfed.engine.types import Upload
from hetfed.executors.simulate import round_train_loss
from hetfed.runs.runner import run_experiment

#: every test here looks at what a run draws or prints while drawing (conftest skips drawing elsewhere)
pytestmark = pytest.mark.draws

FAST = {"train": {"rounds": 4, "eval_every": 2}}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report") / "run"
    run_experiment(build_config(FAST), out=out, progress=False, present=present_run)
    return out


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory) -> Path:
    from rich.console import Console

    from hetfed.config_io import parse_grid
    from hetfed.runs.sweep import run_sweep

    out = tmp_path_factory.mktemp("report") / "sweep"
    grid = parse_grid(["partition.opt_out=0,0.2", "partition.kind=feature_clusters,iid"])
    run_sweep(build_config(FAST), grid, seeds=2, out=out, progress=False, console=Console(quiet=True),
              present=present_sweep)
    return out


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    if os.environ.get("HETFED_TEST_REQUIRE_CHROMIUM"):
        pytest.fail("headless Chromium is required here (HETFED_TEST_REQUIRE_CHROMIUM) but not installed")
    pytest.skip("no Chromium on this machine (CI installs Debian's chromium)")


def render(page: Path, tmp_path: Path) -> tuple[dict[str, str], Path]:
    """Open the page in headless Chromium: the DOM after load (its self-check attributes) and a screenshot."""
    exe = chromium()
    flags = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             f"--user-data-dir={tmp_path / 'chromium-profile'}", "--virtual-time-budget=10000"]
    dom = subprocess.run([*flags, "--dump-dom", page.resolve().as_uri()], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    shot = tmp_path / f"{page.parent.name}.png"
    subprocess.run([*flags, "--window-size=1280,3000", f"--screenshot={shot}", page.resolve().as_uri()],
                   capture_output=True, timeout=120, check=True)
    body = re.search(r"<body([^>]*)>", dom)
    assert body, dom[:500]
    return dict(re.findall(r'(data-[a-z]+)="([^"]*)"', body.group(1))), shot


def assert_renders(page: Path, tmp_path: Path, min_figures: int, min_tables: int) -> None:
    attrs, shot = render(page, tmp_path)
    ok, total = (int(v) for v in attrs["data-figures"].split("/"))
    assert ok == total >= min_figures, attrs  # every embedded figure decoded by the browser
    assert int(attrs["data-tables"]) >= min_tables, attrs
    assert shot.is_file() and shot.stat().st_size > 20_000  # a page with content, not a blank one


# ------------------------------------------------------------------ runs


def test_a_run_writes_a_self_contained_report(run_dir):
    page = (run_dir / "report.html").read_text()
    for section in ("overview", "results", "learning curves", "per-client results", "federation", "config",
                    "environment"):
        assert f">{section}</h2>" in page
    assert "http://" not in page.replace("http://www.w3.org", "") and "https://" not in page  # opens offline
    assert page.count('src="data:image/png;base64,') >= 6
    assert "local acc (mean ± CI over clients)" in page and "torch" in page and "seed: 0" in page


def test_the_run_report_renders_in_a_browser(run_dir, tmp_path):
    assert_renders(run_dir / "report.html", tmp_path, min_figures=6, min_tables=4)


def test_learning_curves_are_in_words_and_mark_the_best_round(run_dir):
    svg = (run_dir / "figures" / "learning_curves.svg").read_text()
    assert "global test accuracy" in svg and "training loss" in svg
    assert "best model (by validation)" in svg
    assert "global_accuracy" not in svg and "local_accuracy_mean" not in svg


def test_metrics_csv_holds_every_rounds_training_loss(run_dir):
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    train = [r for r in rows if r["split"] == "train"]
    for method in ("relu", "cgau"):
        mine = [r for r in train if r["method"] == method and r["metric"] == "train_loss"]
        assert [int(r["round"]) for r in mine] == [1, 2, 3, 4]  # every round, evaluated or not
        assert all(0 < float(r["value"]) < 10 for r in mine)
        counts = {r["metric"] for r in train if r["method"] == method} - {"train_loss"}
        assert counts == {"clients_sampled", "clients_dropped", "clients_late", "clients_rejected_nonfinite",
                          "clients_rejected_norm", "clients_aggregated", "round_skipped",  # the round's clients (#13)
                          "round_time", "sim_time", "downlink_bytes", "uplink_bytes"}  # its clock (#49)


def test_the_rounds_training_loss_weights_clients_by_their_samples():
    upload = Upload([0, 1, 2], {}, torch.tensor([10.0, 30.0, 60.0]), {"train_loss": torch.tensor([1.0, 2.0, 4.0])})
    assert round_train_loss(upload) == pytest.approx((10 * 1 + 30 * 2 + 60 * 4) / 100)
    assert round_train_loss(Upload([0], {}, torch.tensor([5.0]), {})) is None  # nothing reported: no row
    assert round_train_loss(None) is None  # a skipped round


def test_a_failed_run_still_gets_a_report(tmp_path, monkeypatch):
    from hetfed.executors import updates as sim

    real, calls = sim.evaluation_steps, {"n": 0}

    def interrupt_third(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(sim, "evaluation_steps", interrupt_third)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(build_config({"train": {"rounds": 5}}), out=tmp_path / "r", progress=False, present=present_run)
    assert main(["report", str(tmp_path / "r")]) == 0
    page = (tmp_path / "r" / "report.html").read_text()
    assert "failed — interrupted" in page and "learning curves" in page


def test_no_report_draws_nothing_and_says_how_to_draw_it_later(tmp_path, capsys):
    """`--no-report` (run and sweep): no figures and no report.html, one line naming `hetfed report DIR`, which then
    draws them from the directory."""
    fast = ["--set", "train.rounds=2", "--set", "methods=[{algorithm: fedavg}]", "--set", "heterogeneity.iid_draws=0"]
    run, sweep = tmp_path / "run", tmp_path / "sweep"
    assert main(["run", *fast, "--no-report", "--out", str(run)]) == 0
    assert main(["sweep", str(REPO / "configs" / "default.yaml"), *fast, "--seeds", "1", "--no-report",
                 "--out", str(sweep)]) == 0
    printed = capsys.readouterr().out
    for d in (run, sweep):
        assert not (d / "report.html").exists() and not list(d.glob("figures/*")), d
        assert f"`hetfed report {d}` draws them" in printed.replace("\n", ""), printed
        assert main(["report", str(d)]) == 0
        assert (d / "report.html").is_file() and list(d.glob("figures/*.svg")), d


def test_the_api_draws_no_report_when_asked_and_refuses_a_switch_that_is_not_one(tmp_path):
    import hetfed

    fast = {"train": {"rounds": 2}, "methods": [{"algorithm": "fedavg"}], "heterogeneity": {"iid_draws": 0}}
    run = hetfed.run(fast, out=tmp_path / "run", progress=False, report=False)
    sweep = hetfed.sweep(fast, {"train.local_steps": [2]}, seeds=1, out=tmp_path / "sweep", report=False)
    for d in (run, sweep):
        assert not (d.dir / "report.html").exists() and not list(d.dir.glob("figures/*")), d.dir
        assert d.report().is_file() and list(d.dir.glob("figures/*.svg")), d.dir
    with pytest.raises(hetfed.ConfigError, match=r"^report='no' is not allowed: expected True or False$"):
        hetfed.run(fast, out=tmp_path / "never", report="no")
    for switch in ("progress", "resume", "stack", "report"):  # "no" is truthy: it was taken as True
        with pytest.raises(hetfed.ConfigError, match=rf"^{switch}='no' is not allowed: expected True or False$"):
            hetfed.sweep(fast, {"train.local_steps": [2]}, seeds=1, out=tmp_path / "never", **{switch: "no"})
    with pytest.raises(hetfed.ConfigError, match=r"^progress=1 is not allowed"):
        hetfed.run(fast, out=tmp_path / "never", progress=1)
    assert not (tmp_path / "never").exists()


def test_report_of_something_else_is_one_line_exit_2(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "neither a run directory" in err and "Traceback" not in err
    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "not a directory" in capsys.readouterr().err


# ------------------------------------------------------------------ sweeps


def test_a_sweep_writes_a_report_with_every_figure(sweep_dir, tmp_path):
    page = (sweep_dir / "report.html").read_text()
    assert "mean ± 95% CI (Student t over seeds" in page and "heterogeneity of the clients" in page
    assert "partition.opt_out=0,partition.kind=iid" in page  # every run listed
    assert_renders(sweep_dir / "report.html", tmp_path, min_figures=8, min_tables=4)


def test_two_key_grids_get_metric_figures_with_a_panel_per_value(sweep_dir):
    svg = (sweep_dir / "figures" / "best.global_accuracy.svg").read_text()
    assert "partition.kind = feature_clusters" in svg and "partition.kind = iid" in svg
    assert "n = 2 seeds" in svg


# ------------------------------------------------------------------ the figure fixes, one by one


def _table(keys: dict, methods=("a", "b"), metric="best.global_accuracy", mean=0.9, ci=0.5, n=2):
    import itertools

    rows = []
    for combo in itertools.product(*keys.values()):
        for m in methods:
            rows.append({**dict(zip(keys, combo, strict=True)), "method": m, "metric": metric, "mean": mean,
                         "ci95": ci, "n": n})
    return rows


def _band_ys(fig) -> np.ndarray:
    ys = [p.vertices[:, 1] for ax in fig.axes for c in ax.collections for p in c.get_paths()]
    return np.concatenate(ys) if ys else np.zeros(0)


def test_bounded_metrics_bands_are_clipped_and_say_n_and_the_ci_method():
    from hetfed.analysis.figures import plot_sweep

    grid = {"partition.shuffle": [0.0, 0.5, 1.0]}
    fig = plot_sweep(_table(grid), grid, "best.global_accuracy", None)
    ys = _band_ys(fig)
    assert len(ys) and ys.max() <= 1.0 + 1e-9 and ys.min() >= 0.4 - 1e-9  # 0.9 ± 0.5 drawn as [0.4, 1]
    assert "n = 2 seeds" in fig._suptitle.get_text() and "Student t" in fig._suptitle.get_text()
    assert fig.axes[0].get_ylim()[1] <= 1.05


def test_categorical_keys_keep_the_grids_order_and_are_not_joined_by_lines():
    from hetfed.analysis.figures import plot_sweep

    grid = {"partition.kind": ["shards", "iid", "dirichlet"]}
    fig = plot_sweep(_table(grid, mean=0.5, ci=0.1), grid, "best.global_accuracy", None)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["shards", "iid", "dirichlet"]
    for line in ax.get_lines():
        assert line.get_linestyle() == "None" or len(line.get_xdata()) <= 2  # error-bar caps/stems only
    xs = sorted({round(float(x), 3) for line in ax.get_lines() if line.get_linestyle() == "None"
                 for x in line.get_xdata()})
    assert len(xs) >= 6  # two methods side by side at each of three positions: neither hides the other


def test_alpha_over_orders_of_magnitude_gets_a_log_axis_and_overlapping_methods_stay_visible():
    from hetfed.analysis.figures import plot_sweep

    grid = {"partition.alpha": [0.05, 0.1, 1, 100]}
    fig = plot_sweep(_table(grid, mean=0.7, ci=0.0), grid, "best.global_accuracy", None)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log"
    lines = [ln for ln in ax.get_lines() if len(ln.get_xdata()) == 4]
    assert len(lines) == 2  # identical values: the two methods differ in marker and colour
    assert lines[0].get_marker() != lines[1].get_marker() and lines[0].get_color() != lines[1].get_color()
    linear = plot_sweep(_table({"partition.shuffle": [0, 0.5, 1]}), {"partition.shuffle": [0, 0.5, 1]},
                        "best.global_accuracy", None)
    assert linear.axes[0].get_xscale() == "linear"


def test_swept_sections_tick_only_what_differs_and_the_axis_says_what_they_share():
    """A grid of whole sections (`--grid 'partition={kind: iid},{kind: iid, rotations: [180, 0]}'`) was drawn with
    each value's JSON as its tick, the ticks running into one another."""
    from hetfed.analysis.figures import plot_sweep
    from hetfed.runs.sweep_tables import cell

    values = [{"clients": 20, "kind": "iid"}, {"clients": 20, "kind": "iid", "rotations": [180, 0]},
              {"clients": 20, "kind": "iid", "label_swaps": [None, [1, 7], [3, 8], [4, 9]]}]
    grid = {"partition": [cell(v) for v in values]}
    ax = plot_sweep(_table(grid, mean=0.5, ci=0.1), grid, "best.global_accuracy", None).axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == [
        "—", "rotations: [180, 0]", "label_swaps: [null,\n[1, 7], [3, 8], [4,\n9]]"]  # wrapped at 20
    assert ax.get_xlabel().endswith("(every one: clients: 20, kind: iid)")
    kinds = plot_sweep(_table({"partition.kind": ["iid", "dirichlet"]}), {"partition.kind": ["iid", "dirichlet"]},
                       "best.global_accuracy", None).axes[0]
    assert [t.get_text() for t in kinds.get_xticklabels()] == ["iid", "dirichlet"] and "every one" not in \
        kinds.get_xlabel()
    seven = {"partition.kind": [f"kind{i}" for i in range(7)]}  # each category gets room for its tick
    assert plot_sweep(_table(seven), seven, "best.global_accuracy", None).get_size_inches()[0] >= 1.25 * 7


def test_no_two_of_the_first_64_series_look_alike():
    from hetfed.analysis.plotstyle import style

    looks = {(style(i)["color"], style(i)["marker"]) for i in range(64)}
    assert len(looks) == 64  # nine methods as points drew the ninth as the first (same colour, same marker)


def test_legends_sit_outside_the_data():
    from hetfed.analysis.figures import plot_sweep

    grid = {"partition.shuffle": [0.0, 1.0]}
    fig = plot_sweep(_table(grid), grid, "best.global_accuracy", None)
    assert not fig.axes[0].get_legend() and fig.legends  # a figure legend, anchored right of the axes
    anchor = fig.legends[0].get_bbox_to_anchor().transformed(fig.transFigure.inverted())
    assert anchor.x0 >= 0.99


def test_metric_names_are_words():
    from hetfed.analysis.plotstyle import key_label, metric_label, metric_range

    assert metric_label("best.local_accuracy_mean") == "local test accuracy (mean over clients), best model"
    assert metric_label("final.global_accuracy") == "global test accuracy, final round"
    assert "Γ" in metric_label("gamma") and key_label("partition.alpha").startswith("Dirichlet")
    assert metric_range("best.global_auc") == (0.0, 1.0) and metric_range("gamma_excess") == (None, None)


def test_a_report_of_nodes_with_their_own_data_says_why_it_draws_no_clients(tmp_path):
    from hetfed.analysis.report import _federation

    html = _federation(tmp_path, {"dataset": "nodes", "heterogeneity": {"gamma": 1.5}})
    assert "the nodes hold their own data" in html and "<img" not in html and "<svg" not in html
    assert "federation.npz not recorded" in _federation(tmp_path, {"dataset": "digits", "heterogeneity": {}})


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc: a folder no file can be made in")
def test_a_report_out_that_cannot_be_written_is_one_line_naming_it(run_dir, capsys):
    """`hetfed report RUN --out /proc/r.html` (a folder that exists, where no file can be made — as an unwritable
    one, which root could write to): exit 2 and one line naming --out, not the temporary file's OS error."""
    assert main(["report", str(run_dir), "--out", "/proc/r.html"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --out '/proc/r.html' cannot be written: ") and len(err.splitlines()) == 1, err
