"""The ``hetfed`` command line.

Every user-facing failure is a HetfedError: printed in one line without a
traceback, exit status 2. Ctrl-C exits with 130 after the run directory has been
marked failed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table

from hetfed import __version__
from hetfed.config import Config, dump_config, load_config
from hetfed.errors import HetfedError

console = Console()
err_console = Console(stderr=True)


def _add_config_args(p: argparse.ArgumentParser, config_required: bool = False) -> None:
    if config_required:
        p.add_argument("config", help="YAML config file")
    else:
        p.add_argument("config", nargs="?", default=None, help="YAML config file (default: built-in)")
    p.add_argument(
        "--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key, e.g. --set partition.shuffle=0.4 (repeatable)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hetfed", description="Federated learning on clients that are not alike."
    )
    parser.add_argument("--version", action="version", version=f"hetfed {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("partition", help="simulate clients and measure their heterogeneity")
    _add_config_args(p)
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--plot", metavar="FILE", help="write a figure: client×class heat map and PCA view")
    p.set_defaults(func=cmd_partition)

    p = sub.add_parser("run", help="train the configured methods and write a run directory")
    _add_config_args(p)
    p.add_argument("--out", metavar="DIR", help="run directory (default: runs/<name>-<time>)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("sweep", help="a grid of configs × seeds, aggregated with 95%% CIs")
    _add_config_args(p, config_required=True)
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...", help="a swept key (repeatable)")
    p.add_argument("--seeds", type=int, default=3, help="seeds per grid point (0..N-1)")
    p.add_argument("--out", metavar="DIR", help="sweep directory")
    p.add_argument("--resume", action="store_true", help="reuse the completed runs already in --out")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("demo", help="small demonstrations: xor (CGAU paper, Appendix A)")
    p.add_argument("which", choices=["xor"], help="which demo")
    p.add_argument("--out", metavar="DIR", help="output directory (figures + summary.json)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=150)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("config", help="print the resolved config (defaults filled in) as YAML")
    _add_config_args(p)
    p.set_defaults(func=cmd_config)
    return parser


def cmd_demo(args: argparse.Namespace) -> int:
    from hetfed.experiments.xor_demo import CLIENTS, run_xor_demo

    out_dir, summary = run_xor_demo(args.out, seed=args.seed, rounds=args.rounds)
    table = Table(title="XOR over an 'up' and a 'down' client: test accuracy per client")
    cols = ["model", "client", "accuracy", "filter cond off", "gate cond off", "all cond off"]
    for col in cols:
        table.add_column(col, justify="right")
    for name, entry in summary["models"].items():
        for client in CLIENTS:
            row = entry[client]
            cells = [row.get(k) for k in ("accuracy", "accuracy_no_filter_cond", "accuracy_no_gate_cond", "accuracy_no_cond")]
            table.add_row(name, client, *("-" if c is None else f"{c:.3f}" for c in cells))
    console.print(table)
    console.print(f"figures and summary.json in {out_dir}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    console.print(dump_config(load_config(args.config, args.sets)), markup=False, highlight=False)
    return 0


def partition_report(config: Config) -> dict:
    """The JSON-ready description of a partition and its heterogeneity."""
    from hetfed.pipeline import prepare

    prep = prepare(config, progress=True)  # extraction progress goes to stderr
    fed, het = prep.federation, prep.heterogeneity
    counts = fed.class_counts()
    clients = [
        {
            "client": k,
            "size": int(counts[k].sum()),
            "train": int(len(fed.train[k])),
            "val": int(len(fed.val[k])),
            "test": int(len(fed.test[k])),
            "class_counts": counts[k].tolist(),
            "classes": int((counts[k] > 0).sum()),
            "opted_out": bool(fed.opted_out[k]),
            "label_emd": het.label_emd[k],
        }
        for k in range(fed.n_clients)
    ]
    return {
        "dataset": config.dataset.name,
        "embed": config.embed.kind,
        "partition": config.partition.model_dump(),
        "seed": config.seed,
        "n_clients": fed.n_clients,
        "n_classes": fed.n_classes,
        "global_test_size": int(len(fed.y_global_test)),
        "gamma": het.gamma,
        "label_emd_mean": het.label_emd_mean,
        "js_mean": het.js_mean,
        "clients": clients,
        "_federation": fed,
    }


def cmd_partition(args: argparse.Namespace) -> int:
    config = load_config(args.config, args.sets)
    report = partition_report(config)
    fed = report.pop("_federation")
    if args.plot:
        from hetfed.experiments.figures import plot_partition

        plot_partition(fed, args.plot, seed=config.seed)
    if args.json:
        print(json.dumps(report))
        return 0
    table = Table(title=f"{config.dataset.name} · {config.partition.kind} · {fed.n_clients} clients")
    for col in ("client", "size", "train/val/test", "classes", "opted out", "label EMD"):
        table.add_column(col, justify="right")
    for c in report["clients"]:
        table.add_row(
            str(c["client"]), str(c["size"]), f"{c['train']}/{c['val']}/{c['test']}",
            str(c["classes"]), "yes" if c["opted_out"] else "", f"{c['label_emd']:.3f}",
        )
    console.print(table)
    console.print(
        f"Γ (mean Fréchet distance, client vs rest) = {report['gamma']:.4f}   "
        f"label EMD mean = {report['label_emd_mean']:.3f}   JS mean = {report['js_mean']:.4f}   "
        f"global test = {report['global_test_size']} (balanced)"
    )
    if args.plot:
        console.print(f"figure written to {args.plot}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from hetfed.experiments.runner import run_experiment

    config = load_config(args.config, args.sets)
    run_experiment(config, out=args.out, progress=not args.quiet, console=console)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from hetfed.experiments.sweep import parse_grid, run_sweep

    config = load_config(args.config, args.sets)
    grid = parse_grid(args.grid)
    run_sweep(config, grid, seeds=args.seeds, out=args.out, progress=not args.quiet, console=console, resume=args.resume)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except HetfedError as err:
        err_console.print(f"[bold red]error:[/] {err}", markup=True, highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
