"""FedAvg vs FedSGD on Shakespeare: rounds to reach a target accuracy, and the accuracy curves (#27).

    python results/shakespeare/curves.py RUN_ROLES RUN_IID OUT_DIR [--targets 0.30 0.35 0.40]

RUN_ROLES / RUN_IID: run directories of ``hetfed run configs/shakespeare.yaml`` (the role partition) and of
the same with ``--set partition.kind=iid --set partition.clients=100``. Accuracy is the global test set's
(the union of every role's last 20% of windows: McMahan et al.'s test set), read from metrics.csv at the
run's evaluation rounds (every 5th round for FedAvg, every 10th for FedSGD): "rounds to reach" is the first
evaluated round at or above the target, so it is rounded up to the evaluation cadence.
"""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path


def curve(run: Path, method: str) -> list[tuple[int, float]]:
    with open(run / "metrics.csv", newline="") as fh:
        return [(int(r["round"]), float(r["value"])) for r in csv.DictReader(fh)
                if r["method"] == method and r["split"] == "summary" and r["metric"] == "global_accuracy"]


def first_at(points: list[tuple[int, float]], target: float) -> int | None:
    return next((rnd for rnd, acc in points if acc >= target), None)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("roles")
    parser.add_argument("iid")
    parser.add_argument("out")
    parser.add_argument("--targets", type=float, nargs="+", default=[0.30, 0.35, 0.40])
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = {"roles (non-IID)": Path(args.roles), "IID": Path(args.iid)}
    curves = {(p, m): curve(d, m) for p, d in runs.items() for m in ("fedavg", "fedsgd")}
    rows = []
    for p in runs:
        for target in args.targets:
            rows.append({"partition": p, "target": target,
                         **{m: first_at(curves[(p, m)], target) for m in ("fedsgd", "fedavg")}})
    summary = {p: {m: {"best": max(a for _, a in curves[(p, m)]), "last": curves[(p, m)][-1][1],
                       "rounds": curves[(p, m)][-1][0], "first_eval": curves[(p, m)][0][0]}
                   for m in ("fedavg", "fedsgd")} for p in runs}
    (out / "rounds_to_target.json").write_text(json.dumps({"rows": rows, "summary": summary}, indent=1))

    def reached(p: str, m: str, rnd: int | None) -> tuple[str, float | None, str]:
        """The table's text, the number, and its direction: "≤" when reached at the first evaluation
        (it may have been earlier), ">" when never reached in the run."""
        info = summary[p][m]
        if rnd is None:
            return f"> {info['rounds']}", info["rounds"], ">"
        if rnd == info["first_eval"]:
            return f"≤ {rnd}", rnd, "≤"
        return str(rnd), rnd, "="

    lines = ["| partition | target | FedSGD rounds | FedAvg rounds | FedSGD / FedAvg |", "|---|---|---|---|---|"]
    for r in rows:
        sgd_text, sgd, sgd_dir = reached(r["partition"], "fedsgd", r["fedsgd"])
        avg_text, avg, avg_dir = reached(r["partition"], "fedavg", r["fedavg"])
        bound = "≥ " if (sgd_dir == ">" or avg_dir == "≤") else ""
        ratio = "-" if (sgd_dir == ">" and avg_dir == ">") else f"{bound}{sgd / avg:.0f}×"
        lines.append(f"| {r['partition']} | {r['target']:.0%} | {sgd_text} | {avg_text} | {ratio} |")
    lines += ["", "| partition | method | best | last | rounds |", "|---|---|---|---|---|"]
    lines += [f"| {p} | {m} | {s['best']:.3f} | {s['last']:.3f} | {s['rounds']} |"
              for p, ms in summary.items() for m, s in ms.items()]
    (out / "rounds_to_target.md").write_text("\n".join(lines) + "\n")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    styles = {"fedavg": "-", "fedsgd": "--"}
    colours = {"roles (non-IID)": "C0", "IID": "C1"}
    for (p, m), pts in curves.items():
        ax.plot([r for r, _ in pts], [a for _, a in pts], styles[m], color=colours[p],
                label=f"{'FedAvg (E=1, B=10)' if m == 'fedavg' else 'FedSGD (E=1, B=∞)'} · {p}")
    for target in args.targets:
        ax.axhline(target, color="0.8", lw=0.8, zorder=0)
    ax.set_xscale("log")
    ax.set_xlabel("communication round (log)")
    ax.set_ylabel("global test accuracy (next character)")
    ax.set_title("Shakespeare, 4 plays, char-LSTM 2×64: FedAvg vs FedSGD")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "accuracy_curves.png", dpi=110)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
