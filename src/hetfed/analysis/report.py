"""``hetfed report DIR``: one self-contained ``report.html`` for a run or a sweep directory.

Everything is read back from what the run wrote (``config.yaml``, ``metrics.csv``,
``summary.json``, ``federation.npz``; a sweep's ``sweep.json``), so a report can
be made again at any time, also for a failed run (it shows what was finished).
Figures are embedded as PNG data URIs: the page opens offline, alone, anywhere.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import math
import os
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from hetfed.analysis.plotstyle import key_label, metric_label, metric_range
from hetfed.errors import RunError
from hetfed.runs.rundir import (
    CONFIG,
    CURVES_TABLE,
    FEDERATION,
    FIGURES,
    METRICS,
    REPORT,
    RUNS_TABLE,
    STATUS,
    SUMMARY,
    SWEEP_RECORD,
    SWEEP_REQUEST,
    read_metric_rows,
)
from hetfed.runs.sweep_tables import (
    DEFENDED,
    LEAKED,
    TUNED_BY,
    TUNED_SHOWN,
    read_curves_table,
    task_keys,
    tuned_held_out,
    tuned_over,
    tuned_rows,
)

#: the columns of a run's results table: (metric in the summary's "best", heading)
RUN_COLUMNS = (("local_accuracy_mean", "local acc (mean ± CI over clients)"), ("local_accuracy_p10", "local acc p10"),
               ("global_accuracy", "global acc"), ("server_accuracy", "unseen acc"), ("local_auc_mean", "local AUC"),
               ("global_auc", "global AUC"))
#: the metrics of a sweep's table, as columns
SWEEP_COLUMNS = ("best.local_accuracy_mean", "best.local_accuracy_p10", "best.global_accuracy", "final.global_accuracy",
                 "best.server_accuracy", "best.local_auc_mean", "best.global_auc", *LEAKED, *DEFENDED,
                 "seconds_per_round")
#: grid points drawn in a sweep's per-client figure
MAX_PANELS = 12
DATA_COLUMNS = ("gamma", "gamma_iid", "gamma_excess", "gamma_given_label_excess", "label_emd_mean")


def write_report(directory: str | Path, out: str | Path | None = None, problems: list[str] | None = None) -> Path:
    """Write the report of a run or sweep directory (default ``DIR/report.html``); returns its path.

    A report written in place also (re)writes the figures the directory keeps (a run's
    ``figures/learning_curves.png`` and ``figures/clients.png``, a sweep's learning curves and metrics against its
    keys; PNG and SVG), from the same drawing. A sweep's figures that could not be drawn are added to ``problems``."""
    d = Path(directory)
    if not d.is_dir():
        raise RunError(f"report: {str(d)!r} is not a directory; expected a run or sweep directory")
    if (d / SWEEP_RECORD).is_file():
        page = sweep_report(d, keep=d / FIGURES if out is None else None, problems=problems)
    elif (d / CONFIG).is_file() and (d / METRICS).is_file():
        page = run_report(d, keep=d / FIGURES if out is None else None)
    else:
        raise RunError(f"report: {str(d)!r} is neither a run directory (config.yaml and metrics.csv) nor a sweep "
                       "directory (sweep.json); expected a directory written by hetfed run or hetfed sweep")
    target = Path(out) if out is not None else d / REPORT
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(page)
    mask = os.umask(0)
    os.umask(mask)
    os.chmod(tmp, 0o666 & ~mask)
    os.replace(tmp, target)
    return target


# ------------------------------------------------------------------ reading a run


def read_metrics(path: Path, keep: str | None = None) -> list[dict]:
    """metrics.csv as rows with typed round and value; ``keep``: only the lines that hold this text
    (:func:`~hetfed.runs.rundir.read_metric_rows`: a sweep's report reads one per-client metric of every run)."""
    rows: list[dict] = list(read_metric_rows(path, keep))
    for row in rows:
        row["round"] = int(row["round"])
        row["value"] = float(row["value"]) if row["value"] not in ("", "nan", "None") else math.nan
    return rows


def _json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def per_client(rows: list[dict], method: str, metric: str, rnd: int | None) -> list[float]:
    """One method's per-client values of a metric at a round (the last evaluated one if None)."""
    mine = [r for r in rows if r["method"] == method and r["split"] == "client" and r["metric"] == metric]
    if not mine:
        return []
    rnd = rnd if rnd is not None and any(r["round"] == rnd for r in mine) else max(r["round"] for r in mine)
    return [r["value"] for r in mine if r["round"] == rnd]


def mean_ci(values: list[float]) -> tuple[float, float, int]:
    """Mean, 95% CI half-width (Student t) and n of the finite values."""
    from hetfed.runs.sweep_tables import ci95

    v = [x for x in values if x is not None and not math.isnan(x)]
    return (float(np.mean(v)) if v else math.nan), ci95(v), len(v)


# ------------------------------------------------------------------ HTML pieces


def _esc(value: Any) -> str:
    return html.escape(str(value))


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}" if abs(value) < 1e4 else f"{value:.3g}"
    return _esc(value)


def table(headers: list[str] | None, rows: list[list[Any]], caption: str = "") -> str:
    """An HTML table; ``headers=None`` for a key/value table without a heading row."""
    head = "".join(f"<th>{_esc(h)}</th>" for h in headers or [])
    body = "".join("<tr>" + "".join(f"<td>{c if isinstance(c, Markup) else _fmt(c)}</td>" for c in row) + "</tr>"
                   for row in rows)
    cap = f"<caption>{_esc(caption)}</caption>" if caption else ""
    thead = f"<thead><tr>{head}</tr></thead>" if headers else ""
    return f"<table>{cap}{thead}<tbody>{body}</tbody></table>"


class Markup(str):
    """A table cell that is already HTML."""


def figure(draw: Callable[[None], Any], caption: str, keep: Path | None = None,
           problems: list[str] | None = None) -> str:
    """Render a figure function (``draw(None)`` → figure) as an embedded PNG; a failure is shown, not fatal (and
    said in ``problems``, for the console).

    ``keep``: also write it there (PNG, and SVG beside it) and embed that PNG: a figure the run or sweep directory
    keeps is drawn once, not once for the file and again for the page."""
    from hetfed.analysis.figures import png_bytes, save

    try:
        fig = draw(None)
        data = base64.b64encode(save(fig, keep).read_bytes() if keep is not None else png_bytes(fig)).decode()
    except Exception as err:  # one broken figure must not cost the page
        if problems is not None:
            problems.append(f"{keep.stem if keep is not None else caption}: {type(err).__name__}: {err}")
        return f'<p class="warn">figure not drawn ({_esc(caption)}): {_esc(type(err).__name__)}: {_esc(err)}</p>'
    return (f'<figure><img alt="{_esc(caption)}" src="data:image/png;base64,{data}">'
            f"<figcaption>{_esc(caption)}</figcaption></figure>")


def page(title: str, sections: list[tuple[str, str]]) -> str:
    nav = " · ".join(f'<a href="#s{i}">{_esc(name)}</a>' for i, (name, _) in enumerate(sections))
    body = "".join(f'<section id="s{i}"><h2>{_esc(name)}</h2>{content}</section>'
                   for i, (name, content) in enumerate(sections))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>
body {{ font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1200px;
       padding: 0 1em; color: #222; line-height: 1.45; }}
h1 {{ font-size: 1.6em; margin-bottom: 0.2em; }} h2 {{ border-bottom: 1px solid #ccc; margin-top: 1.8em; }}
nav {{ font-size: 0.9em; color: #555; }}
table {{ border-collapse: collapse; margin: 0.8em 0; font-size: 0.9em; }}
th, td {{ border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: right; }}
th {{ background: #f3f3f3; }} td:first-child, th:first-child {{ text-align: left; }}
tbody tr:nth-child(even) {{ background: #fafafa; }} caption {{ caption-side: bottom; font-size: 0.85em; color: #555;
       text-align: left; padding-top: 0.3em; }}
figure {{ margin: 1em 0; }} figure img {{ max-width: 100%; height: auto; }}
figcaption {{ font-size: 0.85em; color: #555; }}
pre {{ background: #f6f6f6; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }}
.warn {{ color: #a34000; }} .muted {{ color: #666; font-size: 0.9em; }}
</style></head>
<body><h1>{_esc(title)}</h1><nav>{nav}</nav>{body}
<script>
// a self-check a headless browser can read: every figure decoded, every table present
window.addEventListener("load", function () {{
  var imgs = Array.prototype.slice.call(document.images);
  var ok = imgs.filter(function (i) {{ return i.complete && i.naturalWidth > 0; }}).length;
  document.body.setAttribute("data-figures", ok + "/" + imgs.length);
  document.body.setAttribute("data-tables", String(document.querySelectorAll("table").length));
}});
</script></body></html>
"""


def _environment(env: dict | None, extra: dict[str, Any]) -> str:
    rows = [[k, v] for k, v in extra.items() if v is not None]
    rows += [[k, v] for k, v in (env or {}).items()]
    return table(None, rows) if rows else "<p class='muted'>not recorded by the hetfed that made this run</p>"


def _files(files: list[dict]) -> str:
    if not files:
        return ""
    return "<h3>data files read</h3>" + table(["path", "bytes", "SHA-256"], [
        [f.get("path"), f.get("bytes"), Markup(f"<code>{_esc(f.get('sha256', ''))}</code>")] for f in files])


# ------------------------------------------------------------------ a run


def run_report(d: Path, keep: Path | None = None) -> str:
    """A run's page; ``keep``: the folder where the figures the run keeps are written as they are drawn."""
    from hetfed.analysis.figures import plot_learning_curves
    from hetfed.runs.rundir import run_state

    config = (d / CONFIG).read_text()
    summary = _json(d / SUMMARY)
    status = _json(d / STATUS) or {}
    rows = read_metrics(d / METRICS)
    methods = list(dict.fromkeys(r["method"] for r in rows))
    state = run_state(d)
    title = f"hetfed run · {d.name}"
    sections: list[tuple[str, str]] = []

    overview: list[list[Any]] = [["status", state + (f" — {status.get('reason')}" if status.get("reason") else "")]]
    if summary:
        overview += [["dataset", summary.get("dataset")], ["embedding", summary.get("embed")],
                     ["partition", summary.get("partition")], ["clients", summary.get("n_clients")],
                     ["opted out", summary.get("n_opted_out")], ["seed", summary.get("seed")],
                     ["wall time (s)", summary.get("wall_seconds")], ["started", summary.get("started")],
                     ["finished", summary.get("finished")]]
    head = table(None, overview)
    if summary and summary.get("heterogeneity"):
        from hetfed.heterogeneity import gamma_given_label_line, gamma_line

        for line in (gamma_line(summary["heterogeneity"]), gamma_given_label_line(summary["heterogeneity"])):
            head += "" if line is None else f"<p>{_esc(line)}</p>"
    for w in (summary or {}).get("warnings", []):
        head += f'<p class="warn">warning: {_esc(w)}</p>'
    sections.append(("overview", head))

    if summary:
        sections.append(("results", _run_table(summary, rows)))
    leaked = _leakage(d, summary)
    if leaked:
        sections.append(("what the server learnt", leaked))
    from hetfed.analysis.results import CURVE_AXES, defence_curves, run_curves, run_curves_against, run_level

    series = run_level(rows)  # the rows read above: metrics.csv was read again for every curve drawn
    decided = defence_curves(series)
    if decided:
        sections.append(("what the defence decided", _defence(decided, keep)))
    found = _found(rows, keep)
    if found:
        sections.append(("what the server found about each client", found))
    curves = run_curves(series, min_points=2)
    best = {k: m.get("best_round") for k, m in (summary or {}).get("methods", {}).items()}
    curve_html = (figure(lambda p: plot_learning_curves(curves, p, best), "learning curves; ★ the round of the best "
                         "model (lowest validation loss)", keep and keep / "learning_curves.png")
                  if curves else "<p class='muted'>no learning curve: "
                  "fewer than two evaluations per method</p>")
    for x_metric, label in CURVE_AXES.items():  # the simulated clock's time and the bytes sent (docs/async.md)
        against = run_curves_against(series, x_metric)
        if against:
            curve_html += figure(partial(plot_learning_curves, against, xlabel=label), f"learning curves against "
                                 f"{label}", keep and keep / f"curves_{x_metric}.png")
    sections.append(("learning curves", curve_html))

    dist = ""
    best_of = {k: (m.get("best_round") if m.get("best_round") is not None else None)
               for k, m in (summary or {}).get("methods", {}).items()}
    for metric in ("local_accuracy", "global_accuracy", "local_auc"):
        values = {m: per_client(rows, m, metric, best_of.get(m)) for m in methods}
        values = {m: v for m, v in values.items() if v}
        if values:
            dist += figure(partial(_client_distribution, values, metric),
                           f"{metric_label(metric)} of every client (box: quartiles; dots: clients), best model")
    sections.append(("per-client results", dist or "<p class='muted'>no per-client metrics recorded</p>"))
    sections.append(("federation", _federation(d, summary, keep)))
    sections.append(("config", f"<pre>{_esc(config)}</pre>"))
    sections.append(("environment", _environment((summary or {}).get("environment"),
                                                 {"run directory": str(d.resolve())})
                     + _files((summary or {}).get("data_files", []))))
    return page(title, sections)


def _defence(decided: dict[str, Any], keep: Path | None) -> str:
    """The figure of what a run's defence decided in each attacked round (:func:`~hetfed.analysis.results.
    defence_curves`)."""
    from hetfed.analysis.figures import plot_learning_curves

    return figure(partial(plot_learning_curves, decided, shares=True), "what the server's defence decided in each "
                  "attacked round: the shares of the malicious and of the honest updates it left out (screened out "
                  "or given weight 0), and the malicious updates' share of its weight (docs/robustness.md)",
                  keep and keep / "defence.png")


def _found(rows: list[dict], keep: Path | None) -> str:
    """The figure of what a method's server step found about each client, round by round
    (:func:`~hetfed.analysis.results.client_findings`); "" when no method found any."""
    from hetfed.analysis.figures import plot_client_findings
    from hetfed.analysis.results import client_findings

    grids = {f"{finding} ({method})": grid for (finding, method), grid in client_findings(rows).items()}
    if not grids:
        return ""
    return figure(partial(plot_client_findings, grids), "what the server's step found about each client, round by "
                  "round: a number the method's server computes for each client (docs/methods.md, findings)",
                  keep and keep / "client_findings.png")


def _leakage(d: Path, summary: dict | None) -> str:
    """The attack of ``leakage.kind`` (docs/privacy.md): its numbers per method row, the membership ROC curves
    and the reconstructed samples (from ``leakage/<row>.npz``); empty when the run attacked nothing."""
    from hetfed.analysis.figures import plot_membership_roc, plot_reconstructions
    from hetfed.runs.rundir import LEAKAGE

    found = {row: m["leakage"] for row, m in (summary or {}).get("methods", {}).items() if m.get("leakage")}
    if not found:
        return ""
    keys = list(dict.fromkeys(k for numbers in found.values() for k in numbers if k != "attack"))
    html = table(["method", "attack", *keys], [[row, n["attack"], *[n.get(k) for k in keys]]
                                              for row, n in found.items()])
    roc, images = {}, {}
    for row in found:
        path = d / LEAKAGE / f"{row}.npz"
        if not path.exists():
            continue
        with np.load(path) as arrays:
            for model in ("global", "personal"):
                if f"{model}_members" in arrays:
                    roc[f"{row} · {model}"] = (arrays[f"{model}_members"], arrays[f"{model}_others"])
            if "guess" in arrays and arrays["guess"].ndim == 3:
                images[row] = (arrays["truth"], arrays["guess"])
    if roc:
        html += figure(partial(plot_membership_roc, roc), "membership inference on the reported models (log-log: "
                       "the true-positive rate at a low false-positive rate)")
    if images:
        html += figure(partial(plot_reconstructions, images), "gradient inversion of one client's upload: its "
                       "samples nearest each reconstruction (upper rows) and the reconstructions (lower rows)")
    return html


def _run_table(summary: dict, rows: list[dict], when: str = "best") -> str:
    """The methods' metrics of the best model (``when="best"``) or the final round, with CIs over clients."""
    present = [(k, h) for k, h in RUN_COLUMNS if any(k in m[when] for m in summary["methods"].values())]
    headers = ["method", *[h for _, h in present]]
    headers += ["final global acc", "best round"] if when == "best" else []
    headers += ["rounds / epochs", "s/round", "eval s"]
    body = []
    for label, m in summary["methods"].items():
        at = m.get("best_round") if when == "best" else (m.get("rounds") or None)
        row: list[Any] = [label]
        for key, _ in present:
            if key == "local_accuracy_mean":
                mean, ci, n = mean_ci(per_client(rows, label, "local_accuracy", at))
                row.append(Markup(f"{_fmt(mean)} ± {_fmt(ci)} <span class='muted'>(n = {n})</span>") if n
                           else m[when].get(key))
            else:
                row.append(m[when].get(key))
        if when == "best":
            row += [m["final"].get("global_accuracy"), m.get("best_round")]
        row += [m.get("rounds") or m.get("epochs"), m.get("seconds_per_round"), m.get("eval_seconds_per_evaluation")]
        body.append(row)
    if when == "final":
        return table(headers, body, "the model of the last round (personalised views: their one evaluation)")
    from hetfed.runs.summary import stop_line

    notes = "".join(f"<p class='muted'>note ({_esc(k)}): {_esc(m['selection_note'])}</p>"
                    for k, m in summary["methods"].items() if m.get("selection_note"))
    notes += "".join(f"<p class='muted'>{_esc(line)}</p>" for k, m in summary["methods"].items()
                     if (line := stop_line(k, m)) is not None)
    caption = ("best model by validation loss. local: each client's own test set with its own parameters "
               "(CI: Student t over clients); global: the balanced global test set; unseen: the server model "
               "with zero conditioning")
    return table(headers, body, caption) + notes + "<h3>final round</h3>" + _run_table(summary, rows, "final")


def _federation(d: Path, summary: dict | None, keep: Path | None = None) -> str:
    from hetfed.analysis.figures import plot_client_sizes, plot_label_skew, plot_partition_view

    out = ""
    if summary and summary.get("heterogeneity"):
        het = summary["heterogeneity"]
        out += table(["measure", "value"], [[metric_label(k), v] for k, v in het.items()
                                            if isinstance(v, int | float | str) and not isinstance(v, bool)])
    if summary and _on_nodes(summary.get("dataset")):  # a real federation: the server never held the rows
        return out + ("<p class='muted'>the nodes hold their own data: the server never sees their clients' sizes, "
                      "classes or features, so there is nothing to draw here; Γ above comes from the summaries the "
                      "clients sent (docs/flower.md)</p>")
    path = d / FEDERATION
    if not path.is_file():
        return out + "<p class='muted'>federation.npz not recorded (a run made before hetfed wrote it)</p>"
    with np.load(path) as z:
        view = {k: z[k] for k in z.files}
    out += figure(lambda p: plot_client_sizes(view, p), "samples per client (train / validation / test)")
    out += figure(lambda p: plot_partition_view(view, p), "which classes each client holds, and where its samples "
                  "lie in feature space (2-D PCA of up to 5 000 samples)", keep and keep / "clients.png")
    out += figure(lambda p: plot_label_skew(view, p), "label skew per client")
    return out


# ------------------------------------------------------------------ a sweep


def base_config(request: dict):
    """The sweep's base config (None when it cannot be read: the figures that need it are left out)."""
    from hetfed.config import build_config, migrate_legacy

    try:
        return build_config(migrate_legacy(request["config"]))
    except Exception:
        return None


def sweep_report(d: Path, keep: Path | None = None, problems: list[str] | None = None) -> str:
    """A sweep's page; ``keep``: the folder where its figures are written as they are drawn (``problems``: those
    that could not be)."""
    from hetfed.analysis.figures import plot_client_distributions
    from hetfed.analysis.results import sweep_figures
    from hetfed.runs.sweep_tables import MIN_SEEDS_FOR_CI, point_name, shown_point

    record = _json(d / SWEEP_RECORD) or {}
    request = _json(d / SWEEP_REQUEST) or {}
    grid = record.get("grid", {})
    keys = list(grid)
    table_rows = record.get("rows") or []
    runs = record.get("runs", [])
    failed = record.get("failed", [])
    summaries = [(r, _json(Path(r["run_dir"]) / SUMMARY)) for r in runs]
    name = (request.get("config") or {}).get("name", d.name)
    sections: list[tuple[str, str]] = []
    wall = sum(s.get("wall_seconds", 0.0) for _, s in summaries if s)
    overview: list[list[Any]] = [["sweep directory", str(d.resolve())], ["grid", "; ".join(f"{k} = "
                                                                                           f"{', '.join(map(str, v))}"
                                                                        for k, v in grid.items()) or "(none)"],
                ["seeds per point", record.get("seeds")], ["runs complete", len(runs)], ["runs failed", len(failed)],
                ["sum of the runs' wall time (s)", wall]]
    if record.get("merged_from"):  # hetfed merge: the tables of these sweeps, their run directories not kept
        overview.append(["merged from", ", ".join(record["merged_from"])])
    head = table(None, overview)
    if record.get("aggregation_error"):
        head += f"<p class='warn'>aggregation failed: {_esc(record['aggregation_error'])}</p>"
    sections.append(("overview", head))

    points = list(dict.fromkeys(tuple(r[k] for k in keys) for r in table_rows))
    methods = [m for m in dict.fromkeys(r["method"] for r in table_rows) if m != "(data)"]
    cols = [c for c in SWEEP_COLUMNS if any(r["metric"] == c for r in table_rows)]
    cell = {(tuple(r[k] for k in keys), r["method"], r["metric"]): r for r in table_rows}

    def ci_cell(r: dict | None) -> Any:
        if r is None:
            return None
        if r["n"] < MIN_SEEDS_FOR_CI:  # the one rule (hetfed.runs.sweep): no CI below it, here and everywhere
            span = f"range {_fmt(r['min'])}–{_fmt(r['max'])}, " if r.get("min") is not None and r["n"] > 1 else ""
            return Markup(f"{_fmt(r['mean'])} <span class='muted'>({span}n = {r['n']}: too few seeds for a CI)"
                          "</span>")
        lo, _hi = metric_range(r["metric"])
        low = r["mean"] - (r["ci95"] or 0.0)
        clipped = " <span class='muted'>(clipped at 0)</span>" if lo is not None and low < lo else ""
        return Markup(f"{_fmt(r['mean'])} ± {_fmt(r['ci95'])}{clipped} <span class='muted'>(n = {r['n']})</span>")

    def keys_of(p: tuple) -> list[Markup]:
        return [Markup(_esc(v)) for v in p]  # grid values as the user wrote them, not rounded

    body = [[*keys_of(p), m, *[ci_cell(cell.get((p, m, c))) for c in cols]] for p in points for m in methods
            if any((p, m, c) in cell for c in cols)]
    results = table([*keys, "method", *[metric_label(c) for c in cols]], body,
                    "mean ± 95% CI (Student t over seeds; n = seeds that finished); with fewer than 3 seeds, the range "
                    "instead (a t interval on 1 degree of freedom is ~13× the spread)")
    data_cols = [c for c in DATA_COLUMNS if any(r["metric"] == c and r["method"] == "(data)" for r in table_rows)]
    if data_cols:
        results += "<h3>heterogeneity of the clients</h3>" + table(
            [*keys, *[metric_label(c) for c in data_cols]],
            [[*keys_of(p), *[ci_cell(cell.get((p, "(data)", c))) for c in data_cols]] for p in points])
    sections.append(("results", results))
    chosen = _tuned(table_rows, keys, ci_cell, d / RUNS_TABLE)
    if chosen:
        sections.append(("each method at its chosen setting", chosen))

    figs = ""
    try:
        drawn = sweep_figures(table_rows, grid, read_curves_table(d / CURVES_TABLE), base_config(request))
    except Exception as err:
        drawn = []
        figs += f"<p class='warn'>figures not drawn: {_esc(type(err).__name__)}: {_esc(err)}</p>"
        if problems is not None:
            problems.append(f"learning curves: {type(err).__name__}: {err}")
    for stem, draw in drawn:
        if stem.startswith("curves_"):
            caption = f"learning curves: {metric_label(stem[len('curves_'):])}, mean over seeds per grid point"
        elif stem in ("global_vs_local", "global_relative_to_fedavg"):
            caption = {"global_vs_local": "global vs local accuracy (FedMoE paper, Fig. 3)",
                       "global_relative_to_fedavg": "global accuracy relative to FedAvg (FedMoE paper, Fig. 5)"}[stem]
        else:
            caption = f"{metric_label(stem)} against {', '.join(key_label(k) for k in keys)}"
        figs += figure(draw, caption, keep / f"{stem}.png" if keep is not None else None, problems)
    sections.append(("figures", figs or "<p class='muted'>no figures</p>"))

    by_point: dict[str, dict[str, list[float]]] = {}
    for r, s in summaries:
        if not s:
            continue
        rows = read_metrics(Path(r["run_dir"]) / METRICS, keep=",local_accuracy,")
        for label, m in s.get("methods", {}).items():
            by_point.setdefault(point_name(r["point"]), {}).setdefault(label, []).extend(
                per_client(rows, label, "local_accuracy", m.get("best_round")))
    shown = dict(list(by_point.items())[:MAX_PANELS])
    dist = figure(lambda p: plot_client_distributions(shown, "local_accuracy", p),
                  "local test accuracy of every client per grid point, all seeds pooled") if shown else ""
    if len(by_point) > MAX_PANELS:
        dist += f"<p class='muted'>{len(by_point) - MAX_PANELS} more grid points not drawn</p>"
    sections.append(("per-client results", dist or "<p class='muted'>no per-client metrics</p>"))

    run_rows = []
    for r, s in summaries:
        rd = Path(r["run_dir"])
        link = rd / REPORT if (rd / REPORT).is_file() else rd / SUMMARY
        rel = os.path.relpath(link, d)
        run_rows.append([point_name(shown_point(r["point"], r.get("method"))), r["seed"],
                         Markup(f'<a href="{_esc(rel)}">{_esc(rel)}</a>'), (s or {}).get("wall_seconds")])
    for f in failed:
        run_rows.append([point_name(shown_point(f["point"], f.get("method"))), f["seed"],
                         Markup(f"<span class='warn'>failed: {_esc(f['error'])}</span>"), None])
    sections.append(("runs", table(["grid point", "seed", "run", "wall time (s)"], run_rows)))
    import yaml

    sections.append(("config", "<p class='muted'>the base config; each run's own is its config.yaml</p>"
                     f"<pre>{_esc(yaml.safe_dump(request.get('config', {}), sort_keys=False))}</pre>"))
    env = next((s.get("environment") for _, s in summaries if s and s.get("environment")), None)
    sections.append(("environment", _environment(env, {})))
    return page(f"hetfed sweep · {name} · {d.name}", sections)


def _tuned(rows: list[dict], keys: list[str], ci_cell: Callable[[dict | None], Any], values: Path) -> str:
    """Each method at the grid point its validation chose (:func:`hetfed.runs.sweep_tables.tuned_rows`), where the
    grid holds settings to choose among, and each seed at the point the others chose (:func:`~hetfed.runs.
    sweep_tables.tuned_held_out`, from the sweep's runs.csv ``values``); "" otherwise."""
    over, held, chosen = tuned_over(keys), task_keys(keys), tuned_rows(rows, keys)
    if not chosen:
        return ""
    body = [[row["method"], *[Markup(_esc(row["point"][k])) for k in keys], row["by"],
             *[ci_cell(row[m]) for m in TUNED_SHOWN]] for row in chosen]
    caption = (f"the {', '.join(over)} of each method chosen by its clients' validation loss (the lowest mean "
               f"{TUNED_BY} over seeds), and its test metrics there: each method at its own setting, chosen without "
               "its test scores" + (f"; within each {', '.join(held)} (another task or scenario)" if held else ""))
    out = table(["method", *keys, metric_label(TUNED_BY), *[metric_label(m) for m in TUNED_SHOWN]], body, caption)
    if not values.is_file():  # a sweep made before runs.csv
        return out
    with open(values, newline="") as fh:
        held_out = tuned_held_out(csv.DictReader(fh), keys)
    return out + table(["method", *held, "chosen (seeds)", *[metric_label(m) for m in TUNED_SHOWN]], [
        [row["method"], *[Markup(_esc(row[k])) for k in held], "; ".join(f"{p} ({n})" for p, n in
                                                                          row["chosen"].items()),
         *[ci_cell(row[m]) for m in TUNED_SHOWN]] for row in held_out],
        "held out: each seed's test metrics at the point the other seeds' validation loss chose (leave one seed out), "
        "so that no number comes from a choice its own seed took part in")


def _on_nodes(dataset: str | None) -> bool:
    """The run's data lived on the SuperNodes (a dataset that is not registered here: not known to be)."""
    from hetfed.registry import registry_of

    kind = registry_of("dataset").find(dataset) if dataset else None
    return bool(kind is not None and kind.on_nodes)


def _client_distribution(values: dict[str, Any], metric: str, path: Any) -> Any:
    from hetfed.analysis.figures import plot_client_distribution

    return plot_client_distribution(values, metric, path)
