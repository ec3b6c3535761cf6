"""#45: what the console, report.html and the figures say agree, and say what they are. Each test failed on the
main before the fix."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from hetfed.cli import main

#: every test here looks at what a run draws or prints while drawing (conftest skips drawing elsewhere)
pytestmark = pytest.mark.draws

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--set", "train.rounds=1", "--set", "partition.clients=4", "--set", "train.local_steps=2"]


# ------------------------------------------------------------------ 6. one CI rule: none below 3 seeds


@pytest.mark.slow
def test_two_seeds_get_no_ci_in_the_console_the_csv_or_the_report(tmp_path, capsys):
    """The console printed `0.2329 ± 0.5627` at n = 2 (an interval below 0) and `± 0.0000` at n = 1, while
    report.html said "too few seeds for a CI"."""
    out = tmp_path / "s"
    assert main(["sweep", str(ROOT / "configs/default.yaml"), *TINY, "--grid", "partition.shuffle=0,1",
                 "--seeds", "2", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "– below 3 seeds" in " ".join(printed.split())
    rows = [line for line in printed.splitlines() if "global_accuracy" in line]
    assert rows and all("± –" in line for line in rows), rows
    with open(out / "sweep.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert table and all(math.isnan(float(r["ci95"])) for r in table if r["n"] == "2")
    page = (out / "report.html").read_text()
    assert "too few seeds for a CI" in page and "± nan" not in page


def _band_points(ax) -> int:
    """How many finite points the filled CI bands of an axis have."""
    import numpy as np

    return sum(int(np.isfinite(p.vertices).all(axis=1).sum()) for c in ax.collections for p in c.get_paths())


def test_the_curve_figure_draws_no_band_below_three_seeds_and_says_so():
    """The sweep's curve figure drew Student-t bands at n = 2 while the report said "too few seeds"."""
    from hetfed.analysis.figures import plot_mean_curves

    two = {"fedavg": {"p=0": [[(1, 0.2), (2, 0.3)], [(1, 0.4), (2, 0.5)]]}}
    fig = plot_mean_curves(two, "global_accuracy", None)
    assert _band_points(fig.axes[0]) == 0 and "no band below 3 seeds" in fig._suptitle.get_text()
    three = {"fedavg": {"p=0": [[(1, 0.2), (2, 0.3)], [(1, 0.4), (2, 0.5)], [(1, 0.3), (2, 0.45)]]}}
    assert _band_points(plot_mean_curves(three, "global_accuracy", None).axes[0]) > 0


# ------------------------------------------------------------------ 7. merge writes report.html and prints a table


@pytest.mark.slow
def test_merge_prints_the_table_and_writes_the_report(tmp_path, capsys):
    for seed in (0, 1):
        assert main(["sweep", str(ROOT / "configs/default.yaml"), *TINY, "--grid", "partition.shuffle=0",
                     "--set", f"seed={seed}", "--seeds", "1", "--out", str(tmp_path / f"s{seed}"), "--quiet"]) == 0
    capsys.readouterr()
    assert main(["merge", str(tmp_path / "s0"), str(tmp_path / "s1"), "--out", str(tmp_path / "m")]) == 0
    printed = capsys.readouterr().out
    assert "sweep: mean ± 95% CI over seeds" in printed and "global_accuracy" in printed
    assert (tmp_path / "m" / "report.html").is_file() and "report.html" in printed


def test_label_emd_per_client_is_the_same_number_in_the_cli_and_the_api(capsys):
    import json

    import hetfed

    pytest.importorskip("pandas")
    assert main(["partition", "--json"]) == 0
    cli = [c["label_emd"] for c in json.loads(capsys.readouterr().out)["clients"]]
    api = hetfed.build_federation(None).clients()["label_emd_train"].tolist()
    assert api == pytest.approx(cli, abs=1e-12)


# ------------------------------------------------------------------ 8. the progress bar at 80 columns


@pytest.mark.parametrize("width", [80, 120])
def test_the_round_bar_shows_accuracy_counts_and_labelled_times_within_the_terminal(width):
    """At every width the bar showed `acc -` (the runner updated a field the bar does not show), and at 80
    columns it cut the counts (`100/1…`) and the unlabelled elapsed time (`0:00:…`)."""
    import io

    from rich.console import Console

    from hetfed.console import round_progress
    from hetfed.runs import summary as runner

    buf = io.StringIO()
    console = Console(file=buf, force_terminal=True, width=width, color_system=None)
    with round_progress(True, console) as bar:
        task = bar.add_task("relu:fedavg-long-name", total=100, acc="-", rate="")
        # the runner's own round callback fields (not a copy of them)
        fields = runner.round_fields({"global_accuracy": 0.8123}, {"train_s": 1.0, "eval_s": 0.2}, 100)
        bar.update(task, completed=100, **fields)
    line = [ln for ln in buf.getvalue().replace("\r", "\n").splitlines() if "100/100" in ln][-1]
    text = line.replace("\x1b[2K", "").rstrip()
    assert len(text) <= width and "…" not in text, text
    assert "acc 0.812" in text and "elapsed 0:00:0" in text and "ETA" in text, text


def test_the_progress_rate_is_the_latest_rounds_not_the_runs_average():
    """A run whose first rounds were slow (a compile, a start beside another process) showed their drag in its rate
    long after: 1 000 rounds at 10/s after 10 slow ones read 5.0 rounds/s. The bar's rate is its last 20 rounds'."""
    from hetfed.runs import observers
    from hetfed.runs.summary import round_fields

    assert round_fields(None, {"train_s": 110.0, "eval_s": 0.0}, 1010)["rate"].startswith("9.2 rounds/s")
    assert round_fields(None, {"train_s": 110.0, "eval_s": 0.0}, 1010, (990, 108.0))["rate"].startswith("10.0 rounds/s")
    assert round_fields(None, {"train_s": 5.0, "eval_s": 0.0}, 1, (1, 5.0))["rate"].startswith("5.0 s/round")

    shown: list[str] = []

    class Bar:
        def update(self, task, completed, rate, **fields):
            shown.append(rate)

    class Beat:
        def beat(self):
            pass

    watch = observers.ProgressObserver(Bar(), 0, Beat())
    seconds = 0.0
    for rnd in range(1, 111):
        seconds += 10.0 if rnd <= 10 else 0.1  # ten slow rounds, then ten a second
        watch.round_done(rnd, None, {"train_s": seconds, "eval_s": 0.0})
    assert shown[0].startswith("10.0 s/round") and shown[-1].startswith("10.0 rounds/s"), (shown[0], shown[-1])


# ------------------------------------------------------------------ 9. no silent waits; figures drawn once


def test_a_run_says_it_is_writing_the_figures_and_draws_each_kept_figure_once(tmp_path, capsys, monkeypatch):
    """8–20 s passed in silence after the last round while the figures and report.html were written, and the
    run's two kept figures were drawn twice (once for figures/, once for the page)."""
    from hetfed.analysis import figures

    drawn: list[str] = []
    for name in ("plot_learning_curves", "plot_partition_view"):
        real = getattr(figures, name)
        monkeypatch.setattr(figures, name, lambda *a, _r=real, _n=name, **k: (drawn.append(_n), _r(*a, **k))[1])
    out = tmp_path / "r"
    assert main(["run", *TINY, "--set", "train.rounds=2", "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "writing the figures and report.html" in err
    assert drawn.count("plot_partition_view") == 1
    # learning curves against rounds, and against the uplink bytes where methods send different amounts (relu vs
    # cgau): each drawn once, for its file and the page alike
    kept = sorted(p.name for p in (out / "figures").glob("*curves*.png"))
    assert drawn.count("plot_learning_curves") == len(kept) and "learning_curves.png" in kept
    for stem in ("learning_curves", "clients"):
        assert (out / "figures" / f"{stem}.png").stat().st_size > 1000 and (out / "figures" / f"{stem}.svg").is_file()
    assert "data:image/png;base64," in (out / "report.html").read_text()


def test_a_sweep_draws_each_figure_once_and_warns_of_one_it_cannot_draw(tmp_path, capsys, monkeypatch):
    """A sweep's figures were drawn twice (once for figures/, once for report.html), and its learning curves read
    every run's metrics.csv once per metric: 3.5 s of a 20-seed, 300-round sweep's 4 s of presenting. Now each is
    drawn once, from curves.csv; one that fails is a warning on the console and in the page, the others are kept."""
    from hetfed.analysis import figures

    drawn: list[str] = []
    real_curves = figures.plot_mean_curves
    monkeypatch.setattr(figures, "plot_mean_curves", lambda *a, **k: (drawn.append("curves"), real_curves(*a, **k))[1])

    def broken(*_a, **_k):
        raise RuntimeError("no ink")

    monkeypatch.setattr(figures, "plot_sweep", broken)
    out = tmp_path / "s"
    config = str(Path(__file__).resolve().parents[2] / "configs" / "default.yaml")
    assert main(["sweep", config, *TINY, "--set", "train.rounds=2", "--grid", "train.optimizer.lr=0.05,0.1",
                 "--seeds", "1", "--out", str(out)]) == 0
    kept = sorted(p.name for p in (out / "figures").glob("curves_*.png"))
    assert kept == ["curves_global_accuracy.png", "curves_local_accuracy_mean.png"] and len(drawn) == len(kept)
    assert not list((out / "figures").glob("best.*"))  # the broken ones: not drawn, said
    err = capsys.readouterr()
    assert "warning: figure not drawn: best.global_accuracy: RuntimeError: no ink" in err.out + err.err
    assert "no ink" in (out / "report.html").read_text()


def test_the_python_api_shows_progress_by_default():
    import inspect

    import hetfed

    assert inspect.signature(hetfed.run).parameters["progress"].default is True


# ------------------------------------------------------------------ 10. words that say what the numbers are


def test_a_space_instead_of_equals_in_set_is_named_not_taken_for_a_config_file(capsys):
    """`--set train.rounds 3` said "config file '3' does not exist"."""
    assert main(["run", "--set", "train.rounds", "3"]) == 2
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "--set 'train.rounds' is not allowed: expected key=value with '=' (not a space)" in line, line
    assert "--set train.rounds=3" in line


def test_sweep_help_says_where_seeds_start_and_what_quiet_does(capsys):
    with pytest.raises(SystemExit):
        main(["sweep", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "the config's seed, seed + 1, …, seed + N − 1" in text and "0..N-1" not in text
    assert "print only the sweep directory" in text


@pytest.mark.slow
def test_a_quiet_sweep_prints_no_table(tmp_path, capsys):
    assert main(["sweep", str(ROOT / "configs/default.yaml"), *TINY, "--grid", "partition.shuffle=0", "--seeds", "1",
                 "--out", str(tmp_path / "s"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "mean ± 95% CI" not in out and f"sweep directory: {tmp_path / 's'}" in out


def test_the_results_footnote_explains_unseen_for_every_kind_of_method_and_the_global_test_set(capsys):
    from rich.console import Console

    from hetfed.runs.summary import print_summary

    summary = {"dataset": "shakespeare", "partition": "natural", "n_clients": 3, "gamma": 0.1, "wall_seconds": 1.0,
               "global_test_balanced": False, "methods": {"ditto": {
                   "best": {"global_accuracy": 0.5, "server_accuracy": 0.4}, "final": {"global_accuracy": 0.5},
                   "seconds_per_round": 0.1}}}
    console = Console(width=200, record=True)
    print_summary(summary, Path("r"), console)
    text = " ".join(console.export_text().split())
    assert "personalised methods: the shared model without a client's own parameters" in text
    assert "not class-balanced" in text and "the balanced global test set" not in text


def test_no_personal_test_sets_asked_for_is_not_warned_about():
    """configs/shakespeare.yaml sets partition.test_fraction: 0 and warned "18 of 18 clients have no test
    data"; a client too small for the test share it was given is still warned about."""
    from hetfed.config import PartitionConfig
    from hetfed.partition import federation_warnings, make_federation
    from tests.synthetic import ShiftedGaussians

    def warned(fraction: float) -> bool:
        fed = make_federation(ShiftedGaussians(n=9), PartitionConfig(kind="iid", clients=3,
                                                                     test_fraction=fraction), 0)
        return any("no test data" in w for w in federation_warnings(fed))

    assert not warned(0.0) and warned(0.1)


def test_the_final_table_and_the_gamma_line_fit_80_columns_without_cutting_a_value(tmp_path):
    """#72 §4: at 80 columns the table cut values (`0.00…`) and headers (`meth…`) and the Γ line broke mid-figure."""
    import json

    from rich.console import Console

    from hetfed.cli import main
    from hetfed.runs.summary import print_summary

    assert main(["run", "--set", "train.rounds=2", "--set", "partition.clients=4", "--out", str(tmp_path / "r"),
                 "--quiet"]) == 0
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    console = Console(width=80, record=True, force_terminal=False)
    print_summary(summary, tmp_path / "r", console)
    text = console.export_text()
    assert max(len(line.rstrip()) for line in text.splitlines() if not line.startswith("run directory")) <= 80
    assert "…" not in text and "method" in text
    lines = text.splitlines()
    assert any(line.startswith("Γ = ") for line in lines)
    assert any(line.startswith("ΔΓ = Γ − Γ_IID = ") and line.split("= ")[-1][0].isdigit() for line in lines)
    assert any(line.startswith("ΔΓ(x|y) = ") for line in lines)  # Γ(x|y)'s line, split the same way


def test_a_loading_note_is_printed_as_it_is_not_as_markup():
    """Class and role names in brackets were taken for Rich's style tags and vanished (``classes [shirt, coat]``
    printed as ``classes  kept``)."""
    from rich.console import Console

    from hetfed.console import print_loading

    console = Console(record=True, width=200)
    print_loading(console, ["classes [shirt, coat] kept", "roles [bold] kept"], ["client [coat] has one class"])
    assert console.export_text().splitlines() == ["classes [shirt, coat] kept", "roles [bold] kept",
                                                  "warning: client [coat] has one class"]


def test_a_sweeps_run_trained_one_at_a_time_tells_its_rounds_every_ten_seconds_after_its_place(monkeypatch):
    """A long run of a sweep was silent until it ended (its ETA too: the first comes from a finished run). Its
    rounds now get a line every 10 s, after the run's place in the sweep; none for a method shorter than that, and
    none at a method's end (the sweep's own line says the run is done)."""
    import io
    import time

    from hetfed.console import make_console
    from hetfed.runs import sweep_progress as sweep

    clock = [1000.0]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])  # the sweep's clock and the lines' alike
    console = make_console()
    console.file = out = io.StringIO()
    tracker = sweep.SweepProgress(4, 1, console)
    lines = tracker.within(2, {"partition.alpha": 0.1}, 7)
    assert lines is not None
    display = lines.display(console)
    task = display.add_task("fedavg", total=100, acc="-", rate="")
    display.update(task, completed=1)
    clock[0] += 9.0
    display.update(task, completed=50)
    assert out.getvalue().count("[run") == 0  # nothing in the first ten seconds, not even the first round
    clock[0] += 1.5
    display.update(task, completed=60, acc="0.812")
    assert "[run 2/4, partition.alpha=0.1 seed=7] fedavg: rounds 60/100 · 10 s · acc 0.812" in out.getvalue()
    clock[0] += 3.0
    display.update(task, completed=100)  # the end: the sweep's "done" line says it
    assert out.getvalue().count("[run") == 1
    assert sweep.SweepProgress(4, 0, None).within(1, {}, 0) is None  # quiet: the run shows nothing
    import pickle

    assert pickle.loads(pickle.dumps(lines)) == lines  # a worker process is handed it (--jobs)


def test_a_private_run_ends_by_saying_its_epsilon_and_a_plain_run_says_nothing_of_it(tmp_path, capsys):
    """A run's ε (client level, DP-FedAvg's noise) was in summary.json and the sweep's tables only: its own end,
    what a user reads first, said nothing of the guarantee it had bought."""
    import json

    from hetfed.runs.summary import privacy_line

    argv = ["run", "--set", "train.rounds=2", "--methods", "relu", "--no-report"]
    assert main([*argv, "--set", "privacy.noise_multiplier=1.0", "--out", str(tmp_path / "p")]) == 0
    m = json.loads((tmp_path / "p" / "summary.json").read_text())["methods"]["relu"]
    line = f"privacy (relu): client-level ε = {m['epsilon']:.4g} after 2 noised rounds, at δ = 1e-05"
    assert m["delta"] == 1e-5 and line in capsys.readouterr().out
    assert main([*argv, "--out", str(tmp_path / "q")]) == 0
    assert "privacy (" not in capsys.readouterr().out
    assert privacy_line("m", {"epsilon": None, "dp_rounds": 3, "record_epsilon": 2.5, "delta": 1e-6}) == (
        "privacy (m): client-level ε = ∞ (no guarantee) after 3 noised rounds; record-level (DP-SGD, its worst "
        "client) ε = 2.5, at δ = 1e-06")
