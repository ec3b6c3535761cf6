"""Markdown tables of sweeps, from their sweep directories (every run's summary.json).

    python results/tables.py attack SWEEP_DIR   # #13: final global accuracy per attack × aggregator
    python results/tables.py attack SWEEP_DIR --defence   # what each defence left out: the shares of the
                                          # malicious and of the honest updates, over the attacked rounds, and
                                          # the malicious updates' mean share of its weight
    python results/tables.py dp SWEEP_DIR       # #13: accuracy and ε per noise multiplier
    python results/tables.py paired SWEEP_DIR [BASELINE] [--final]   # each method and its paired difference to
                                          # FedAvg (or to BASELINE); best by validation, or --final: the last round
    python results/tables.py leaderboard SWEEP_DIR   # #25: personal accuracy (weighted, mean, worst 10%) and
                                          # global accuracy per method, best round by validation and last round
    python results/tables.py pfllib SWEEP_DIR [SWEEP_DIR …]   # #74: every method of PFLlib's published
        # Fashion-MNIST table (pfllib_published.json, with its source) against the sweeps' runs of it, runs stopped
        # by a time budget's SIGTERM included (each read up to its last evaluation)
    python results/tables.py heterogeneity-figure OUT.png METRIC SWEEP_DIR [SWEEP_DIR …]
        # #25: every method's best METRIC against each sweep's (partition's) ΔΓ, one line per method
    python results/tables.py runs FOLDER BASELINE [METRIC …]   # #28: from a results folder's runs.csv (one value
        # per seed): every method's best-by-validation and last-round METRIC (default global_accuracy and
        # local_accuracy_mean), and its paired difference to BASELINE: mean [95% CI], Wilcoxon p, wins
    python results/tables.py clock SWEEP_DIR BASELINE --time T --updates R [--figure OUT]   # #49: every method's
        # global accuracy at simulated time T and after R server updates (the last evaluation at or before each),
        # and its paired difference to BASELINE; --figure: mean curves against simulated time and against updates
    python results/tables.py bytes SWEEP_DIR [--figure OUT]   # #49: every method's best and last global and local
        # accuracy and its total uplink MB, and its paired difference to its own uncompressed row (NAME_f32 for
        # NAME_*); --figure: mean global accuracy against cumulative uplink bytes
    python results/tables.py grid KEY METRIC SWEEP_DIR [SWEEP_DIR …]
        # one row per value of the swept KEY, one column per method (× the other swept keys),
        # cells: best METRIC (e.g. global_accuracy, local_accuracy_mean); Γ per row when KEY is a partition key

Reads every run's summary.json (listed in sweep.json), so a method whose training
diverged under attack is counted as what the server ended with: its final model
(NaN parameters) is scored like any other.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from hetfed.engine.summary import ci95_over


def _sweep_runs(sweep: Path):
    """Each run of the sweep as sweep.json lists it (its point, seed, run_dir), with its summary.json."""
    for run in json.loads((sweep / "sweep.json").read_text())["runs"]:
        yield run, json.loads((Path(run["run_dir"]) / "summary.json").read_text())


def _runs(sweep: Path):
    for run, summary in _sweep_runs(sweep):
        yield run["point"], summary


def _cell(values: list[float]) -> str:
    v = [x for x in values if x is not None]
    if len(v) == 1:
        return f"{v[0]:.3f} (1 seed)"
    return f"{np.mean(v):.3f} ± {ci95_over(v) or 0:.3f}" if v else "-"


def _attack_of(run_dir: Path) -> tuple[str, float]:
    """A run's attack (its own keys beside the kind, where they differ from the kind's defaults) and malicious
    share, from its resolved config.yaml."""
    from hetfed.config import AttackConfig

    section = dict(_configured(run_dir, "attack"))
    kind = section.pop("kind")
    default = AttackConfig.model_validate({"kind": kind}).model_dump(mode="json")
    own = ", ".join(f"{k} {v:g}" if isinstance(v, float) else f"{k} {v}" for k, v in section.items()
                    if k != "fraction" and v is not None and v != default.get(k))
    return (f"{kind} ({own})" if own else kind), section.get("fraction", 0.1)


def _rates_cell(rates: list[dict[str, float]]) -> str:
    """The mean shares of the malicious and of the honest updates a defence left out and of its weight the malicious
    ones got, over seeds ("-": it weighs no update)."""
    if not any(rates):
        return "-"
    shown = []
    for key in ("defence.attackers_excluded", "defence.honest_excluded", "defence.attack_weight"):
        values = [r[key] for r in rates if key in r]
        shown.append(f"{np.mean(values):.2f}" if values else "–")  # a sweep made before hetfed kept the weight
    return " / ".join(shown)


def attack_table(sweep: Path, metric: str = "global_accuracy", when: str = "final", defence: bool = False) -> str:
    """One row per attack and malicious share, one column per method: ``metric`` of the ``when`` round (mean ± 95 %
    CI over seeds), or (``defence``) the shares of the malicious and of the honest updates the defence left out."""
    from hetfed.runs.sweep_tables import defence_rates

    cells: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    diverged: dict[tuple, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    methods: list[str] = []
    for run, summary in _sweep_runs(sweep):
        key = _attack_of(Path(run["run_dir"]))
        others = ", ".join(f"{k}={v}" for k, v in run["point"].items() if k.split(".")[0] != "attack")
        for method, m in summary["methods"].items():
            name = method + (f" ({others})" if others else "")  # one column a method and point of the other keys
            methods += [name] if name not in methods else []
            acc = m[when].get(metric)
            if acc is None and metric == "global_accuracy":
                acc = 0.1  # NaN model: argmax 0 on a balanced test set
            cells[key][name].append(defence_rates(m) if defence else acc)
            diverged[key][name] += m.get("diverged_at") is not None
    lines = ["| attack | malicious | " + " | ".join(methods) + " |", "|---|---|" + "---|" * len(methods)]
    for (kind, frac), row in cells.items():
        if kind == "none" and frac != min(f for k, f in cells if k == "none"):
            continue  # no attack: the fraction does not matter
        shown = [(_rates_cell if defence else _cell)(row[m])
                 + (f" ({diverged[(kind, frac)][m]}✗)" if diverged[(kind, frac)][m] else "") for m in methods]
        lines.append(f"| {kind} | {'-' if kind == 'none' else f'{frac:.0%}'} | " + " | ".join(shown) + " |")
    if defence:
        return "\n".join(lines) + ("\n\nmalicious / honest updates the defence left out (screened out or weighted 0), "
                                   "shares over the attacked rounds / the malicious updates' mean share of its "
                                   "weight; means over seeds; -: the rule weighs no update\n")
    return (
        "\n".join(lines) + f"\n\n{'final' if when == 'final' else 'best-by-validation'} {metric}, mean ± 95% CI over "
        "seeds (Student t); (k✗): runs that diverged\n"
    )


def dp_table(sweep: Path) -> str:
    rows: dict[object, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for point, summary in _runs(sweep):
        z = point["privacy.noise_multiplier"]
        for m in summary["methods"].values():
            rows[z]["global"].append(m["final"].get("global_accuracy"))
            rows[z]["local"].append(m["final"].get("local_accuracy_mean"))
            rows[z]["eps"].append(m.get("epsilon"))
    lines = ["| noise multiplier z | ε (δ = 1e-5) | final global accuracy | final local accuracy |",
             "|---|---|---|---|"]
    for z, row in rows.items():
        eps = [e for e in row["eps"] if e is not None]
        shown_eps = "no DP" if z is None else ("∞ (clip only)" if not eps else f"{np.mean(eps):.2f}")
        lines.append(f"| {'-' if z is None else z} | {shown_eps} | {_cell(row['global'])} | {_cell(row['local'])} |")
    return "\n".join(lines) + "\n"


def paired_table(sweep: Path, baseline: str = "fedavg", when: str = "best") -> str:
    """Per method (and grid point, when the sweep has several): best global and local accuracy (mean ± CI over
    seeds) and the paired difference to the baseline on the same partition (each run holds every method on one
    federation). ``when``: ``best`` (the model chosen by validation loss) or ``final`` (the last round)."""
    metrics = (("global", "global_accuracy"), ("local", "local_accuracy_mean"))
    values: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    diffs: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    timing: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    rows: list[str] = []
    for point, summary in _runs(sweep):
        where = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in point.items())
        base = summary["methods"][baseline][when]
        for name, m in summary["methods"].items():
            row = name + (f" ({where})" if where else "")
            rows += [row] if row not in rows else []
            for short, key in metrics:
                v, b = m[when].get(key), base.get(key)
                values[row][short].append(v)
                if v is not None and b is not None and name != baseline:
                    diffs[row][short].append(v - b)
            timing[row]["s"].append(m.get("seconds_per_round"))
            timing[row]["server"].append(m.get("server_seconds_per_round"))
    lines = [f"| method | global acc | Δ global vs {baseline} | local acc | Δ local vs {baseline} | s/round | server "
             "s/round |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        d = [_signed(diffs[row][s]) if diffs[row][s] else "-" for s, _ in metrics]
        lines.append(f"| {row} | {_cell(values[row]['global'])} | {d[0]} | {_cell(values[row]['local'])} | {d[1]} "
                     f"| {_mean(timing[row]['s'])} | {_mean(timing[row]['server'])} |")
    n = max(len(v["global"]) for v in values.values())
    chosen = "best model by validation loss" if when == "best" else "the last round's model"
    return "\n".join(lines) + (f"\n\n{chosen}; mean ± 95% CI (Student t) over n = {n} seeds; "
                               "Δ: paired difference on the same partition and seed\n")


def _mean(values: list) -> str:
    known = [v for v in values if v is not None]
    return f"{np.mean(known):.4f}" if known else "-"


def _signed(values: list[float]) -> str:
    return f"{np.mean(values):+.3f} ± {ci95_over(values) or 0:.3f}" if values else "-"


def _configured(run_dir: Path, key: str):
    """A dotted key's value in a run's resolved config.yaml."""
    import yaml

    node = yaml.safe_load((run_dir / "config.yaml").read_text())
    for part in key.split("."):
        node = node[part]
    return node


def grid_table(key: str, metric: str, sweeps: list[Path]) -> str:
    cells: dict[object, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    gammas: dict[object, list] = defaultdict(list)
    columns: list[str] = []
    for sweep in sweeps:
        for run in json.loads((sweep / "sweep.json").read_text())["runs"]:
            point, summary = run["point"], json.loads((Path(run["run_dir"]) / "summary.json").read_text())
            value = point[key] if key in point else _configured(Path(run["run_dir"]), key)  # not swept here
            others = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in point.items() if k != key)
            gammas[value].append(summary.get("gamma"))
            for name, m in summary["methods"].items():
                column = name + (f" ({others})" if others else "")
                columns += [column] if column not in columns else []
                cells[value][column].append(m["best"].get(metric))
    with_gamma = key.startswith("partition.")  # otherwise a row mixes partitions: its mean Γ would mean nothing
    gamma_head, gamma_rule = ("Γ | ", "---|") if with_gamma else ("", "")
    lines = [f"| {key} | {gamma_head}" + " | ".join(columns) + " |", f"|---|{gamma_rule}" + "---|" * len(columns)]
    for value in sorted(cells, key=lambda v: (v is None, v)):
        row = cells[value]
        gamma = f"{_cell(gammas[value])} | " if with_gamma else ""
        lines.append(f"| {value} | {gamma}" + " | ".join(_cell(row[c]) for c in columns) + " |")
    n = max(len(v) for row in cells.values() for v in row.values())
    return (
        "\n".join(lines)
        + f"\n\nbest {metric} (model chosen by validation loss); mean ± 95% CI (Student t) over {n} seeds\n"
    )


LEADERBOARD = (("local_accuracy_weighted", "personal (weighted)"), ("local_accuracy_mean", "personal (mean)"),
               ("local_accuracy_worst10", "worst 10%"), ("global_accuracy", "global"))


def _evaluations(run_dir: Path) -> dict[str, dict[int, dict[str, float]]]:
    """A run's evaluations from its metrics.csv: each row's (method's or view's) summary values by round."""
    import csv

    rows: dict[str, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    with open(Path(run_dir) / "metrics.csv", newline="") as fh:
        for r in csv.DictReader(fh):
            if r["split"] == "summary" and r["client"] == "all" and r["value"] != "":
                rows[r["method"]][int(r["round"])][r["metric"]] = float(r["value"])
    return rows


def _best(evaluations: dict[str, dict[int, dict[str, float]]], metric: str) -> dict[str, float]:
    """Each row's best ``metric`` over its evaluated rounds."""
    return {name: max(ev[metric] for ev in by_round.values() if metric in ev)
            for name, by_round in evaluations.items() if any(metric in ev for ev in by_round.values())}


def _at_lowest_validation_loss(evaluations: dict[str, dict[int, dict[str, float]]], metric: str) -> dict[str, float]:
    """Each row's ``metric`` at its evaluated round of the lowest validation loss (the earliest on a tie)."""
    out = {}
    for name, by_round in evaluations.items():
        rounds = [r for r, ev in sorted(by_round.items()) if metric in ev and np.isfinite(ev.get("val_loss", np.nan))]
        if rounds:
            out[name] = by_round[min(rounds, key=lambda r: by_round[r]["val_loss"])][metric]
    return out


def pfllib_rule(run_dir: Path, metric: str = "local_accuracy_weighted") -> dict[str, float]:
    """PFLlib's reported number per method of one run: the best *test* accuracy over the evaluated rounds (its
    ``max(rs_test_acc)``, the clients' correct predictions over their test samples: ``local_accuracy_weighted``)."""
    return _best(_evaluations(run_dir), metric)


def by_validation(run_dir: Path, metric: str = "local_accuracy_weighted") -> dict[str, float]:
    """Per method of one run: ``metric`` at the evaluated round of the lowest validation loss (the clients' pooled
    validation splits; the earliest such round on a tie), read from metrics.csv, so that a run stopped by a time
    budget (no summary.json) is read the same way."""
    return _at_lowest_validation_loss(_evaluations(run_dir), metric)


def leaderboard_table(sweep: Path) -> str:
    """One row per method; for each metric its best-round (chosen by the clients' validation loss, never by test)
    and last-round value, and PFLlib's number (the best test accuracy over rounds), mean ± 95% CI over seeds; Γ
    and ΔΓ of the partition above the table."""
    cells: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    gammas, excess, seen = [], [], set()
    for run, summary in _sweep_runs(sweep):
        seen.add(run.get("seed"))  # a grid over methods: several runs share a seed
        het = summary.get("heterogeneity") or {}
        gammas.append(summary.get("gamma", het.get("gamma")))
        excess.append(het.get("gamma_excess"))
        pfllib = pfllib_rule(Path(run["run_dir"]))
        for name, m in summary["methods"].items():
            for metric, _ in LEADERBOARD:
                for when in ("best", "final"):
                    cells[name][f"{when}.{metric}"].append(m[when].get(metric))
            cells[name]["pfllib"].append(pfllib.get(name))
    head = " | ".join(f"{label} best | {label} last" for _, label in LEADERBOARD)
    lines = [f"Γ = {_cell(gammas)}, ΔΓ = {_cell(excess)}", "", f"| method | {head} | PFLlib's rule |",
             "|---|" + "---|" * (2 * len(LEADERBOARD) + 1)]
    for name, row in cells.items():
        values = [_cell(row[f"{when}.{metric}"]) for metric, _ in LEADERBOARD for when in ("best", "final")]
        lines.append(f"| {name} | " + " | ".join(values) + f" | {_cell(row['pfllib'])} |")
    return "\n".join(lines) + (
        "\n\nPFLlib's rule: the best personal (weighted) accuracy on the *test* splits over the evaluated rounds, "
        "what PFLlib's leaderboard reports (`max(rs_test_acc)`); an upper bound that chooses the round by test. "
        f"mean ± 95% CI (Student t) over {len(seen)} seeds. best: the round whose model has the lowest validation "
        "loss on the clients' validation splits (PFLlib reports the best round by *test* accuracy, which flatters "
        "every method); last: the final round. personal: each client's own model on its own test split, weighted by "
        "test size (what PFLlib reports) or unweighted; worst 10%: the mean of the worst tenth of clients; global: "
        "the balanced global test set (a personalised model: the mean over clients of their own models)\n")


#: PFLlib's published Fashion-MNIST numbers (practical label skew), each method's mean ± sd, with their source
PUBLISHED = Path(__file__).with_name("pfllib_published.json")


def _read_runs(sweep: Path):
    """Every run of a sweep that finished (its summary.json), or that a signal stopped (its status.json: a time
    budget's SIGTERM, Ctrl-C; its metrics.csv holds every evaluation up to then: a stopped sweep writes no
    sweep.json): its evaluations (:func:`_evaluations`, read once), the algorithm of each of their rows (a method, or
    a view ``label:view``), its configured methods' algorithms, and the rounds each row's model trained. Runs that
    failed otherwise, and runs moved aside by ``--resume``, are left out."""
    import yaml

    made = [*sweep.glob("*/seed=*/config.yaml"), *sweep.glob("*/seed=*/method=*/config.yaml")]  # --each-method's
    for run_dir in sorted(p.parent for p in made if ".incomplete-" not in str(p.parent.relative_to(sweep))):
        methods = yaml.safe_load((run_dir / "config.yaml").read_text())["methods"]
        configured = {m["algorithm"] for m in methods}
        if (run_dir / "summary.json").exists():
            top = json.loads((run_dir / "summary.json").read_text())
            summary = top["methods"]
            algorithms = {name: m.get("algorithm", name).split(":")[0] for name, m in summary.items()}
            # a view scored after the rounds (FedBABU's fine-tuned models) is filed under its epochs: the run's rounds
            yield _evaluations(run_dir), algorithms, configured, {n: m.get("rounds") or top["rounds"]
                                                                  for n, m in summary.items()}
            continue
        status = json.loads((run_dir / "status.json").read_text()) if (run_dir / "status.json").exists() else {}
        if not str(status.get("reason", "")).startswith(("terminated by", "interrupted")):
            continue
        # its configured methods name its rows (``label``, ``label:view``; one method: every row)
        labels = {m["name"]: m["algorithm"] for m in methods}
        evaluations = _evaluations(run_dir)
        yield evaluations, {row: (methods[0]["algorithm"] if len(methods) == 1 else
                                  labels.get(row.split(":")[0], row)) for row in evaluations}, configured, \
            {row: max(by_round) for row, by_round in evaluations.items()}


def _caveated(verdict: str, method: dict) -> str:
    """A row's verdict, and what PFLlib's number measures where it is not the method's own (its entry's ``caveat``:
    found by running PFLlib's code, results/pfllib_code/) — whatever the rounds, the difference is not a gap."""
    return f"{verdict}; {method['caveat']}" if method.get("caveat") else verdict


def pfllib_table(sweeps: Path | list[Path], published: Path = PUBLISHED) -> str:
    """Every method of PFLlib's published table against the sweeps' runs of it (#74 §5): PFLlib's rule
    (:func:`pfllib_rule`, the best test accuracy over the evaluated rounds) and the round chosen by validation
    (:func:`by_validation`) in points, mean ± sd over seeds (numpy's sd, ddof 0, as PFLlib prints it), the rounds
    each method's runs reached (the fewest of its seeds: a sweep stopped by a time budget reaches fewer than its
    configured rounds), the published mean ± sd, the difference, and whether it is within one point — or, for a
    method whose runs reached fewer rounds than the published protocol's, that it is not comparable yet. A method is
    matched by its algorithm (each of its views, e.g. FedBABU's global and fine-tuned models, a row of its own);
    PFLlib's methods that hetfed lacks or the sweeps did not run, and the sweeps' methods PFLlib has no number for,
    are listed as such."""
    ref = json.loads(published.read_text())
    ours: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    algorithm: dict[str, str] = {}
    started: set[str] = set()  # the algorithms of every run read, evaluated or not
    for sweep in [sweeps] if isinstance(sweeps, Path) else sweeps:
        for evaluated, algorithms, configured, reached in _read_runs(sweep):
            rule = _best(evaluated, "local_accuracy_weighted")
            val = _at_lowest_validation_loss(evaluated, "local_accuracy_weighted")
            started.update(configured)
            for name, algo in algorithms.items():
                algorithm[name] = algo
                if name in rule:
                    ours[name]["rule"].append(100 * rule[name])
                    ours[name]["val"].append(100 * val.get(name, np.nan))
                    ours[name]["rounds"].append(reached[name])

    def cells(name: str) -> str:
        rule, val = np.asarray(ours[name]["rule"]), np.asarray(ours[name]["val"])
        return (f"{name} | {min(ours[name]['rounds'])} | {rule.mean():.2f} ± {rule.std():.2f} ({len(rule)} seeds) | "
                f"{val.mean():.2f} ± {val.std():.2f}")

    lines = ["| PFLlib's method | hetfed method | rounds | hetfed, PFLlib's rule (%) | hetfed, best by validation (%) "
             "| published (%) | difference (PFLlib's rule) | verdict |", "|---|---|---|---|---|---|---|---|"]
    matched = set()
    for m in ref["methods"]:
        pub = f"{m['mean']:.2f} ± {m['sd']:.2f}"
        names = [n for n in ours if algorithm[n] == m["algorithm"]] if m["algorithm"] else []
        matched.update(names)
        if not names:
            why = ("not in hetfed" if m["algorithm"] is None else
                   f"stopped before its first evaluation (hetfed's `{m['algorithm']}`)" if m["algorithm"] in started
                   else f"not run (hetfed's `{m['algorithm']}`)")
            lines.append(f"| {m['pfllib']} | — | — | — | — | {pub} | — | {_caveated(why, m)} |")
        for name in names:
            diff = np.mean(ours[name]["rule"]) - m["mean"]
            reached = min(ours[name]["rounds"])
            verdict = (f"not comparable: {reached} of the published {ref['rounds']} rounds" if reached < ref["rounds"]
                       else "within 1 point" if abs(diff) <= 1 else "differs by more than 1 point: a finding")
            lines.append(f"| {m['pfllib']} | {cells(name)} | {pub} | {diff:+.2f} | {_caveated(verdict, m)} |")
    for name in [n for n in ours if n not in matched]:
        lines.append(f"| — | {cells(name)} | — | — | no published number |")
    src = ref["source"]
    return "\n".join(lines) + (
        f"\n\nPublished: {ref['what']}; {src['repository']} `{src['path']}` at {src['commit'][:12]} "
        f"({src['committed']}), {src['table']}. Its settings: {ref['settings']}. hetfed's number is PFLlib's rule on "
        "the sweeps' own runs, whatever their settings: compare only a sweep of PFLlib's protocol "
        f"(configs/leaderboard_pfllib_fmnist.yaml), and only at its {ref['rounds']} rounds as a reproduction "
        "(rounds: the evaluated rounds the method's runs reached, the fewest over its seeds).\n")


def heterogeneity_points(metric: str, sweeps: list[Path]) -> dict[str, list[tuple[float, float, float, str]]]:
    """Per method, one point per sweep (a partition): (mean ΔΓ, mean best ``metric``, its 95% CI, partition)."""
    points: dict[str, list[tuple[float, float, float, str]]] = defaultdict(list)
    for sweep in sweeps:
        excess, values, label = [], defaultdict(list), ""
        for _, summary in _runs(sweep):
            excess.append((summary.get("heterogeneity") or {}).get("gamma_excess"))
            label = summary.get("partition", "")
            for name, m in summary["methods"].items():
                values[name].append(m["best"].get(metric))
        x = float(np.mean([e for e in excess if e is not None])) if any(e is not None for e in excess) else np.nan
        for name, v in values.items():
            v = [a for a in v if a is not None]
            if v:
                points[name].append((x, float(np.mean(v)), ci95_over(v), label))
    return dict(points)


def runs_table(folder: Path, baseline: str, metrics: tuple[str, ...] = ("global_accuracy",
                                                                        "local_accuracy_mean")) -> str:
    """Per grid point and method: mean ± CI of each metric (best by validation / last round) and the paired
    difference to ``baseline`` on the same seeds (:mod:`hetfed.analysis.paired`), from runs.csv."""
    import csv

    from hetfed.analysis.paired import paired

    with open(folder / "runs.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    keys = [k for k in rows[0] if k not in ("seed", "method", "metric", "value")] if rows else []
    values: dict[tuple, dict[int, float]] = defaultdict(dict)
    for r in rows:
        values[(tuple(r[k] for k in keys), r["method"], r["metric"])][int(r["seed"])] = float(r["value"])
    points = list(dict.fromkeys(tuple(r[k] for k in keys) for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows if r["method"] != "(data)"))
    out = []
    for point in points:
        where = ", ".join(f"{k}={v}" for k, v in zip(keys, point, strict=True))
        for metric in metrics:
            out += [f"**{metric}**" + (f" ({where})" if where else ""), "",
                    f"| method | best (by validation) | Δ vs {baseline}, best | last round | Δ vs {baseline}, last | "
                    "best round |",
                    "|---|---|---|---|---|---|"]
            for method in methods:
                cells = []
                for when in ("best", "final"):
                    mine = values.get((point, method, f"{when}.{metric}"), {})
                    base = values.get((point, baseline, f"{when}.{metric}"), {})
                    cells.append(_cell(list(mine.values())) if mine else "-")
                    common = sorted(set(mine) & set(base))
                    cells.append(paired([mine[s] for s in common], [base[s] for s in common]).text()
                                 if method != baseline and common else "-")
                rounds = values.get((point, method, "best_round"), {})
                cells.append(_mean(list(rounds.values())).rstrip("0").rstrip(".") if rounds else "-")
                out.append(f"| {method} | " + " | ".join(cells) + " |")
            out.append("")
    n = len({r["seed"] for r in rows})
    return "\n".join(out) + (f"\nmean ± 95% CI (Student t) over {n} seeds; Δ: paired difference on the same federation "
                             "and seed, [95% CI], two-sided Wilcoxon signed-rank p, seeds where the method won; best "
                             "round: "
                             "the mean round the validation loss chose\n")


def _series(run_dir: Path) -> dict[str, dict[str, list[tuple[int, float]]]]:
    """``{method: {metric: [(round, value)]}}`` of a run's summary rows (``client == all``)."""
    import csv

    out: dict[str, dict[str, dict[int, float]]] = defaultdict(lambda: defaultdict(dict))
    with open(run_dir / "metrics.csv", newline="") as fh:
        for row in csv.DictReader(fh):
            if row["split"] == "summary" and row["client"] == "all":
                out[row["method"]][row["metric"]].setdefault(int(row["round"]), float(row["value"]))
    return {m: {k: sorted(v.items()) for k, v in metrics.items()} for m, metrics in out.items()}


def _sweep_series(sweep: Path) -> list[dict[str, dict[str, list[tuple[int, float]]]]]:
    return [_series(Path(run["run_dir"])) for run in json.loads((sweep / "sweep.json").read_text())["runs"]]


def _at(series: dict[str, list[tuple[int, float]]], metric: str, x_metric: str | None, limit: float) -> float | None:
    """``metric`` at the last evaluation whose x (the round, or ``x_metric``'s value there) is ≤ ``limit``."""
    xs = dict(series.get(x_metric, [])) if x_metric else None
    best = None
    for rnd, value in series.get(metric, []):
        x = rnd if xs is None else xs.get(rnd)
        if x is not None and x <= limit:
            best = value
    return best


def _reached(series: dict[str, list[tuple[int, float]]], metric: str, target: float) -> float | None:
    """The simulated time of the first evaluation whose ``metric`` is at least ``target`` (None: never)."""
    times = dict(series.get("sim_time", []))
    return next((times[r] for r, v in series.get(metric, []) if v >= target and r in times), None)


def clock_table(sweep: Path, baseline: str, time_budget: float, updates: int, metric: str = "global_accuracy",
                target: float | None = None) -> str:
    """#49: each method's ``metric`` at simulated time ``time_budget`` and after ``updates`` server updates (rounds),
    mean ± 95% CI over seeds, and the paired difference to ``baseline``; with ``target``, the simulated time it
    first reached ``target`` (over the seeds that did)."""
    runs = _sweep_series(sweep)
    methods = list(runs[0])
    reach = f" s to {metric} ≥ {target:g} (seeds) |" if target is not None else ""
    lines = [f"| method | at {time_budget:g} s simulated | Δ vs {baseline} | at update {updates} | Δ vs {baseline} | "
             f"simulated s at the last update | updates in the run |{reach}",
             "|---|---|---|---|---|---|---|" + ("---|" if target is not None else "")]
    for m in methods:
        at_t = [_at(r[m], metric, "sim_time", time_budget) for r in runs]
        at_r = [_at(r[m], metric, None, updates) for r in runs]
        base_t = [_at(r[baseline], metric, "sim_time", time_budget) for r in runs]
        base_r = [_at(r[baseline], metric, None, updates) for r in runs]
        d_t = [a - b for a, b in zip(at_t, base_t, strict=True) if a is not None and b is not None]
        d_r = [a - b for a, b in zip(at_r, base_r, strict=True) if a is not None and b is not None]
        end = [r[m]["sim_time"][-1][1] for r in runs]
        last = [r[m]["sim_time"][-1][0] for r in runs]
        row = (f"| {m} | {_cell([v for v in at_t if v is not None])} | "
               f"{_signed(d_t) if m != baseline else '-'} | {_cell([v for v in at_r if v is not None])} | "
               f"{_signed(d_r) if m != baseline else '-'} | {np.mean(end):.0f} | {int(np.mean(last))} |")
        if target is not None:
            hit = [t for t in (_reached(r[m], metric, target) for r in runs) if t is not None]
            row += f" {np.mean(hit):.0f} ({len(hit)}/{len(runs)}) |" if hit else f" never (0/{len(runs)}) |"
        lines.append(row)
    return "\n".join(lines) + (f"\n\n{metric}: the last evaluation at or before the budget; mean ± 95% CI (Student "
                               f"t) over n = {len(runs)} seeds; Δ: paired difference on the same partition, clock "
                               "and seed\n")


def bytes_table(sweep: Path, when: str = "best",
                metrics: tuple[str, ...] = ("global_accuracy", "local_accuracy_mean", "server_accuracy")) -> str:
    """#49: each method's total uplink MB and its ``metrics`` (``when``: ``best`` by validation or ``final``), each
    with its paired difference to the method's own uncompressed row (``NAME_f32`` for ``NAME_*``)."""
    summaries = [s for _p, s in _runs(sweep)]
    runs = _sweep_series(sweep)
    methods = summaries[0]["methods"]
    head = " | ".join(f"{m} | Δ vs f32" for m in metrics)
    lines = [f"| method | uplink MB | {head} |", "|---|---|" + "---|---|" * len(metrics)]
    for m in methods:
        base = None if m.endswith("_f32") else m.split("_", 1)[0] + "_f32"
        cells = []
        for metric in metrics:
            vals = [s["methods"][m][when].get(metric) for s in summaries]
            diffs = ([s["methods"][m][when][metric] - s["methods"][base][when][metric] for s in summaries]
                     if base in methods and None not in vals else [])
            cells += [_cell([v for v in vals if v is not None]) if None not in vals else "-",
                      _signed(diffs) if diffs else "-"]
        mb = [r[m]["uplink_bytes_total"][-1][1] / 1e6 for r in runs]
        lines.append(f"| {m} | {np.mean(mb):.2f} | " + " | ".join(cells) + " |")
    chosen = "the model chosen by validation loss" if when == "best" else "the last round's model"
    return "\n".join(lines) + (f"\n\n{chosen}; mean ± 95% CI over n = {len(summaries)} seeds; Δ: paired difference "
                               "to the same method uncompressed (f32) on the same partition and seed\n")


def against_figure(sweep: Path, x_metric: str, xlabel: str, out: Path, metrics: tuple[str, ...] = ("global_accuracy",),
                   limit: float | None = None, prefix: str = "", log_x: bool = False) -> str:
    """Mean ``metrics`` over seeds (one panel each) against ``x_metric`` (``sim_time``, ``uplink_bytes_total``, or
    ``round``) for the methods named ``prefix…``, each seed's curve interpolated onto one grid up to the shortest
    seed's end (or ``limit``)."""
    from hetfed.analysis.figures import plot_learning_curves

    runs = _sweep_series(sweep)
    panels = {metric: _mean_against(runs, metric, x_metric, limit, prefix) for metric in metrics}
    return str(plot_learning_curves(panels, str(out), xlabel=xlabel, log_x=log_x))


def _mean_against(runs: list, metric: str, x_metric: str, limit: float | None, prefix: str
                  ) -> dict[str, list[tuple[float, float]]]:
    curves: dict[str, list[tuple[float, float]]] = {}
    for m in (m for m in runs[0] if m.startswith(prefix)):
        per_seed = []
        for r in runs:
            xs = dict(r[m].get(x_metric, [])) if x_metric != "round" else None
            pts = [((rnd if xs is None else xs.get(rnd)), v) for rnd, v in r[m].get(metric, [])]
            pts = [(float(x), v) for x, v in pts if x is not None]
            if len(pts) >= 2:
                per_seed.append(pts)
        if not per_seed:
            continue
        end = min(p[-1][0] for p in per_seed)
        end = min(end, limit) if limit is not None else end
        start = max(p[0][0] for p in per_seed)
        grid = np.linspace(start, end, 60) if end > start else np.array([start])
        if x_metric == "uplink_bytes_total" and 0 < start < end:  # bytes span decades: a log grid
            grid = np.geomspace(start, end, 60)
        mean = np.mean([np.interp(grid, [x for x, _ in p], [v for _, v in p]) for p in per_seed], axis=0)
        curves[m] = list(zip(grid.tolist(), mean.tolist(), strict=True))
    return curves


def main(argv: list[str] | None = None) -> int:
    """The command line above; bad arguments get argparse's usage line and exit status 2."""
    ap = argparse.ArgumentParser(prog="python results/tables.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="kind", required=True)
    for kind in ("dp", "leaderboard"):
        sub.add_parser(kind).add_argument("sweep", type=Path, metavar="SWEEP_DIR")
    p = sub.add_parser("attack")
    p.add_argument("sweep", type=Path, metavar="SWEEP_DIR")
    p.add_argument("--metric", default="global_accuracy", help="the final round's metric shown (backdoor_accuracy: "
                   "a backdoor's success rate)")
    p.add_argument("--best", action="store_true", help="the round chosen by validation loss, not the last")
    p.add_argument("--defence", action="store_true", help="what each defence left out, not a metric")
    sub.add_parser("pfllib").add_argument("sweeps", nargs="+", type=Path, metavar="SWEEP_DIR")
    p = sub.add_parser("paired")
    p.add_argument("sweep", type=Path, metavar="SWEEP_DIR")
    p.add_argument("baseline", nargs="?", default="fedavg")
    p.add_argument("--final", action="store_true", help="the last round's values, not the best by validation")
    p = sub.add_parser("runs")
    p.add_argument("sweep", type=Path, metavar="FOLDER")
    p.add_argument("baseline")
    p.add_argument("metrics", nargs="*", default=["global_accuracy", "local_accuracy_mean"], metavar="METRIC")
    p = sub.add_parser("clock")
    p.add_argument("sweep", type=Path, metavar="SWEEP_DIR")
    p.add_argument("baseline")
    p.add_argument("--time", type=float, required=True, help="the simulated-time budget (s)")
    p.add_argument("--updates", type=int, required=True, help="the number of server updates (rounds)")
    p.add_argument("--figure", type=Path, help="write OUT_time.png and OUT_updates.png")
    p.add_argument("--target", type=float, help="also the simulated time each method first reached this accuracy")
    p = sub.add_parser("bytes")
    p.add_argument("sweep", type=Path, metavar="SWEEP_DIR")
    p.add_argument("--final", action="store_true", help="the last round's values, not the best by validation")
    p.add_argument("--figure", type=Path, help="write OUT.png: global accuracy against uplink bytes")
    p = sub.add_parser("grid")
    p.add_argument("key")
    p.add_argument("metric")
    p.add_argument("sweeps", nargs="+", type=Path, metavar="SWEEP_DIR")
    p = sub.add_parser("heterogeneity-figure")
    p.add_argument("out", type=Path, metavar="OUT.png")
    p.add_argument("metric")
    p.add_argument("sweeps", nargs="+", type=Path, metavar="SWEEP_DIR")
    args = ap.parse_args(argv)
    for folder in args.sweeps if "sweeps" in args else [args.sweep]:
        if not folder.is_dir():
            ap.error(f"folder {str(folder)!r} does not exist: expected a sweep or results folder")
    if args.kind == "grid":
        print(grid_table(args.key, args.metric, args.sweeps))
    elif args.kind == "heterogeneity-figure":
        from hetfed.analysis.figures import plot_accuracy_vs_heterogeneity

        print(plot_accuracy_vs_heterogeneity(heterogeneity_points(args.metric, args.sweeps), args.metric,
                                             str(args.out)))
    elif args.kind == "clock":
        print(clock_table(args.sweep, args.baseline, args.time, args.updates, target=args.target))
        if args.figure:
            against_figure(args.sweep, "sim_time", "simulated time (s)", Path(f"{args.figure}_time.png"),
                           limit=args.time)
            against_figure(args.sweep, "round", "server updates (rounds)", Path(f"{args.figure}_updates.png"),
                           limit=args.updates)
    elif args.kind == "bytes":
        print(bytes_table(args.sweep, "final" if args.final else "best"))
        if args.figure:  # one figure per algorithm (the name before its first _), x on a log scale
            for prefix in dict.fromkeys(m.split("_", 1)[0] for m in _sweep_series(args.sweep)[0]):
                against_figure(args.sweep, "uplink_bytes_total", "uplink bytes (cumulative)",
                               Path(f"{args.figure}_{prefix}.png"), ("global_accuracy", "local_accuracy_mean"),
                               prefix=prefix + "_", log_x=True)
    elif args.kind == "pfllib":
        print(pfllib_table(args.sweeps))
    elif args.kind == "runs":
        print(runs_table(args.sweep, args.baseline, tuple(args.metrics)))
    elif args.kind == "paired":
        print(paired_table(args.sweep, args.baseline, when="final" if args.final else "best"))
    else:
        print(attack_table(args.sweep, args.metric, "best" if args.best else "final", args.defence)
              if args.kind == "attack" else
              {"dp": dp_table, "leaderboard": leaderboard_table}[args.kind](args.sweep))
    return 0


if __name__ == "__main__":
    sys.exit(main())
