"""Markdown tables of the attack × aggregator and accuracy-vs-ε sweeps (issue #13), from their sweep directories.

    python results/robustness_tables.py attack SWEEP_DIR   # final global accuracy, mean ± 95% CI over seeds
    python results/robustness_tables.py dp SWEEP_DIR       # accuracy and ε per noise multiplier

Reads every run's summary.json (listed in sweep.json), so a method whose training
diverged under attack is counted as what the server ended with: its final model
(NaN parameters) is scored like any other.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from hetfed.engine.evaluate import ci95_over


def _runs(sweep: Path):
    for run in json.loads((sweep / "sweep.json").read_text())["runs"]:
        yield run["point"], json.loads((Path(run["run_dir"]) / "summary.json").read_text())


def _cell(values: list[float]) -> str:
    v = [x for x in values if x is not None]
    return f"{np.mean(v):.3f} ± {ci95_over(v) or 0:.3f}" if v else "-"


def attack_table(sweep: Path) -> str:
    cells: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    diverged: dict[tuple, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    methods: list[str] = []
    for point, summary in _runs(sweep):
        key = (point["attack.kind"], point["attack.fraction"])
        for name, m in summary["methods"].items():
            methods += [name] if name not in methods else []
            acc = m["final"].get("global_accuracy")
            cells[key][name].append(acc if acc is not None else 0.1)  # NaN model: argmax 0 on a balanced test set
            diverged[key][name] += m.get("diverged_at") is not None
    lines = ["| attack | malicious | " + " | ".join(methods) + " |", "|---|---|" + "---|" * len(methods)]
    for (kind, frac), row in cells.items():
        if kind == "none" and frac != min(f for k, f in cells if k == "none"):
            continue  # no attack: the fraction does not matter
        shown = [_cell(row[m]) + (f" ({diverged[(kind, frac)][m]}✗)" if diverged[(kind, frac)][m] else "")
                 for m in methods]
        lines.append(f"| {kind} | {'-' if kind == 'none' else f'{frac:.0%}'} | " + " | ".join(shown) + " |")
    return "\n".join(lines) + "\n\nfinal global accuracy, mean ± 95% CI over seeds (Student t); (k✗): runs that diverged\n"


def dp_table(sweep: Path) -> str:
    rows: dict[object, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for point, summary in _runs(sweep):
        z = point["privacy.noise_multiplier"]
        for m in summary["methods"].values():
            rows[z]["global"].append(m["final"].get("global_accuracy"))
            rows[z]["local"].append(m["final"].get("local_accuracy_mean"))
            rows[z]["eps"].append(m.get("epsilon"))
    lines = ["| noise multiplier z | ε (δ = 1e-5) | final global accuracy | final local accuracy |", "|---|---|---|---|"]
    for z, row in rows.items():
        eps = [e for e in row["eps"] if e is not None]
        shown_eps = "no DP" if z is None else ("∞ (clip only)" if not eps else f"{np.mean(eps):.2f}")
        lines.append(f"| {'-' if z is None else z} | {shown_eps} | {_cell(row['global'])} | {_cell(row['local'])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    kind, directory = sys.argv[1], Path(sys.argv[2])
    print(attack_table(directory) if kind == "attack" else dp_table(directory))
