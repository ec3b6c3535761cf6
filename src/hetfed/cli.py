"""The ``hetfed`` command line.

Every user-facing failure is a HetfedError: printed in one line without a
traceback, exit status 2. Ctrl-C exits with 130 and SIGTERM with 143, both after
the run directory has been marked failed.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from hetfed import __version__
from hetfed.config import dump_config, load_config
from hetfed.console import make_console, print_loading
from hetfed.engine.host_threads import fit_to_idle_cores
from hetfed.environment import refuse_unknown
from hetfed.errors import ConfigError, HetfedError, HetfedNote, Terminated
from hetfed.listings import cmd_algorithms, cmd_components
from hetfed.partition_export import COMMANDS_FILE, CONFIG_FILE, check_export, export_nodes
from hetfed.partition_report import check_figure_path, partition_report, print_partition
from hetfed.registry import KINDS
from hetfed.runs.rundir import SUMMARY

if TYPE_CHECKING:
    from hetfed.config import Config

console: Console = make_console()
err_console: Console = make_console(stderr=True)


def _add_config_args(p: argparse.ArgumentParser, methods: bool = True) -> None:
    p.add_argument("config", nargs="?", default=None, help="YAML config file (default: built-in)")
    p.add_argument(
        "--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key, e.g. --set partition.shuffle=0.4 (repeatable)",
    )
    if methods:
        p.add_argument("--methods", type=_names, default=None, metavar="NAME,NAME,...",
                       help="only the config's methods of these names, in this order, each with its own settings "
                            "as the config has them (--set methods.N counts these)")


def _names(text: str) -> list[str]:
    """``--methods``' value: names, comma-separated, none empty."""
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"{text!r} has an empty name: expected NAME,NAME,... (e.g. fedavg,ditto)")
    return names


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hetfed", description="Federated learning on clients that are not alike."
    )
    parser.add_argument("--version", action="version", version=f"hetfed {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("partition", help="simulate clients and measure their heterogeneity")
    _add_config_args(p, methods=False)  # partitioning trains no method
    p.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    p.add_argument("--plot", metavar="FILE", help="write a figure: client×class heat map and PCA view")
    p.add_argument("--export", metavar="DIR", help="write the clients as a real federation's SuperNodes' own files "
                   "(node-P.npz), the config that runs the methods on them (federation.yaml) and each node's "
                   "--node-config (nodes.txt): docs/flower.md")
    p.add_argument("--nodes", type=int, metavar="K", help="with --export: K SuperNodes, node P holding the P-th of K "
                   "blocks of the clients (default: one a client)")
    p.set_defaults(func=cmd_partition)

    p = sub.add_parser("run", help="train the configured methods and write a run directory")
    _add_config_args(p)
    p.add_argument("--out", metavar="DIR", help="run directory (default: runs/<name>-<time>)")
    p.add_argument("--quiet", action="store_true", help="no progress or table; print only the run directory")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a failed or killed run from its last checkpoint (its own config.yaml is used)")
    _add_no_report(p)
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("sweep", help="a grid of configs × seeds, aggregated with 95%% CIs")
    _add_config_args(p)
    p.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...", help="a swept key (repeatable)")
    p.add_argument("--seeds", type=int, default=3,
                   help="seeds per grid point: the config's seed, seed + 1, …, seed + N − 1 (default 3)")
    p.add_argument("--out", metavar="DIR", help="sweep directory")
    p.add_argument("--resume", action="store_true", help="reuse the completed runs already in --out")
    p.add_argument("--jobs", type=int, default=1, metavar="N",
                   help="run N grid points at once, in worker processes sharing the cores (default 1)")
    p.add_argument("--stack", action="store_true",
                   help="train the runs in this process as one stack of clients, each round (same numbers as one by "
                        "one, to float tolerance; methods whose client step allows it)")
    p.add_argument("--each-method", action="store_true",
                   help="each of the config's methods a run of its own (seed=S/method=NAME), the tables as one run's: "
                        "with --stack every method's runs train side by side, with --jobs a point's methods in "
                        "parallel")
    p.add_argument("--quiet", action="store_true",
                   help="no progress and no table; print only the sweep directory (and failures)")
    p.add_argument("--dry-run", action="store_true",
                   help="check the sweep as it is checked before it runs (every point's settings, a run's plan on "
                        "its data) and list its runs and what it would do with each (train; with --resume: reuse, "
                        "continue, redo); nothing trained or written")
    _add_no_report(p)
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser("merge", help="one sweep's tables from sweeps of one config run on other seeds or grid "
                                     "values (from their runs.csv and curves.csv; the run directories are not needed)")
    p.add_argument("dirs", nargs="+", metavar="SWEEP_DIR",
                   help="sweep directories, or results folders that kept runs.csv")
    p.add_argument("--out", metavar="DIR", required=True, help="the merged sweep folder (new or empty)")
    p.set_defaults(func=cmd_merge)

    p = sub.add_parser("report", help="write report.html for a run or sweep directory (self-contained, opens offline)")
    p.add_argument("dir", help="a run directory (hetfed run) or a sweep directory (hetfed sweep)")
    p.add_argument("--out", metavar="FILE", help="where to write the page (default: DIR/report.html)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("demo", help="small demonstrations: xor (CGAU paper, Appendix A)")
    p.add_argument("which", choices=["xor"], help="which demo")
    p.add_argument("--out", metavar="DIR", help="output directory (figures + summary.json)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=150)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("flower", help="run on Flower: write the App, start/stop a local deployment, submit a run")
    fsub = p.add_subparsers(dest="flower_command", required=True)
    q = fsub.add_parser("app", help="write hetfed's Flower App (pyproject.toml) into DIR, for `flwr run`")
    q.add_argument("dir")
    q.set_defaults(func=cmd_flower_app)
    q = fsub.add_parser("start", help="start a local deployment: one SuperLink + K SuperNodes (detached)")
    q.add_argument("dir", help="folder for the deployment's logs, PIDs and Flower config")
    q.add_argument("--nodes", "--clients", dest="nodes", type=int,
                   help="SuperNodes to start; node P holds the P-th of K blocks of the federation's clients "
                        "(K = partition.clients: one client per node)")
    q.add_argument("--node-configs", metavar="FILE",
                   help="start one SuperNode a line of FILE with that --node-config: nodes with their own data, "
                        "such as the nodes.txt of `hetfed partition --export`")
    q.add_argument("--port", type=int, default=0, help="SuperLink port (default: a free one)")
    q.add_argument("--host", default="127.0.0.1", help="address the SuperLink listens on (default: loopback only)")
    q.add_argument("--insecure", action="store_true",
                   help="no TLS and no SuperNode keys (default: a CA, certificates and keys are made in "
                        "DIR/credentials)")
    q.add_argument("--allow-insecure-remote", action="store_true",
                   help="allow --insecure on a non-loopback --host (a trusted network only)")
    q.add_argument("--superexec-poll", type=float, default=None, metavar="SECONDS",
                   help="how often Flower's SuperExecs look for messages to start a process for (0.01–60; "
                        "default: $FLWR_SUPEREXEC_TASK_POLL_INTERVAL, else Flower's 1 s — faster polling slowed "
                        "rounds on 2 cores: docs/flower.md)")
    q.set_defaults(func=cmd_flower_start)
    q = fsub.add_parser("stop", help="stop every process of a local deployment (by the PIDs it recorded)")
    q.add_argument("dir")
    q.set_defaults(func=cmd_flower_stop)
    q = fsub.add_parser("run", help="submit a config to a SuperLink with `flwr run`; the ServerApp writes the run "
                                    "directory")
    _add_config_args(q)
    q.add_argument("--deployment", metavar="DIR", help="a local deployment started with `hetfed flower start`")
    q.add_argument("--connection", default=None,
                   help="a SuperLink connection in your Flower config ($FLWR_HOME/config.toml), for remote SuperLinks")
    q.add_argument("--out", metavar="DIR", help="run directory (written where the ServerApp runs)")
    q.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a killed Flower run from its last checkpoint (train.checkpoint_every), with its own "
                        "config.yaml; give no CONFIG, --set or --out")
    _add_no_report(q)
    q.set_defaults(func=cmd_flower_run, quiet=False)

    p = sub.add_parser("config", help="print the resolved config (defaults filled in) as YAML")
    _add_config_args(p)
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("components", help="every registered component of every kind (" + ", ".join(sorted(KINDS))
                       + "): what names it and its parameters")
    p.add_argument("kind", nargs="?", help="one kind: " + ", ".join(sorted(KINDS)))
    p.add_argument("name", nargs="?", help="one component of that kind (its parameters: the keys beside its name)")
    p.add_argument("--json", action="store_true", help="machine-readable: every field of every component")
    p.set_defaults(func=cmd_components)

    p = sub.add_parser("algorithms", help="list every registered algorithm: its parameters and capabilities")
    p.add_argument("name", nargs="?", help="show one algorithm in full")
    p.add_argument("--json", action="store_true", help="machine-readable: every field of every algorithm")
    p.add_argument("--privacy-table", action="store_true",
                   help="print docs/methods.md's privacy table (Markdown): what each method uploads and keeps")
    p.set_defaults(func=cmd_algorithms)
    return parser


def cmd_demo(args: argparse.Namespace) -> int:
    from hetfed.xor_demo import CLIENTS, run_xor_demo

    out_dir, summary = run_xor_demo(args.out, seed=args.seed, rounds=args.rounds)
    table = Table(title="XOR over an 'up' and a 'down' client: test accuracy per client")
    cols = ["model", "client", "accuracy", "filter cond off", "gate cond off", "all cond off"]
    for col in cols:
        table.add_column(col, justify="right")
    for name, entry in summary["models"].items():
        for client in CLIENTS:
            row = entry[client]
            cells = [row.get(k) for k in ("accuracy", "accuracy_no_filter_cond", "accuracy_no_gate_cond",
                                          "accuracy_no_cond")]
            table.add_row(name, client, *("-" if c is None else f"{c:.3f}" for c in cells))
    console.print(table)
    console.print(f"figures and summary.json in {out_dir}", soft_wrap=True)
    return 0


def cmd_flower_app(args: argparse.Namespace) -> int:
    from hetfed.flower.deploy import write_app

    path = write_app(args.dir)
    console.print(f"Flower App written to {path / 'pyproject.toml'}; submit with `hetfed flower run` or "
                  f"`flwr run {path} <connection> --run-config FILE`", soft_wrap=True)
    return 0


def cmd_flower_start(args: argparse.Namespace) -> int:
    from hetfed.flower import require_flwr
    from hetfed.flower.deploy import LocalDeployment, read_node_configs

    require_flwr()
    if args.nodes is None and args.node_configs is None:
        raise ConfigError("hetfed flower start needs --nodes K (simulated partitions) or --node-configs FILE (nodes "
                          "with their own data)")
    configs = read_node_configs(args.node_configs) if args.node_configs is not None else None
    if configs is not None and args.nodes is not None and args.nodes != len(configs):
        raise ConfigError(f"--nodes {args.nodes} is not allowed with --node-configs {args.node_configs!r}: it "
                          f"holds {len(configs)} node configs; expected --nodes {len(configs)} or none")
    nodes = len(configs) if configs is not None else args.nodes
    if nodes < 1:
        raise ConfigError(f"--nodes {args.nodes} is not allowed: expected ≥ 1")
    dep = LocalDeployment(Path(args.dir), nodes, args.port, secure=not args.insecure, host=args.host,
                          allow_insecure_remote=args.allow_insecure_remote, node_configs=configs,
                          superexec_poll=args.superexec_poll).start()
    how = (f"TLS (CA: {dep.credentials_dir / 'ca.crt'}), only registered SuperNode keys admitted" if dep.secure
           else "INSECURE: no TLS, any SuperNode admitted")
    console.print(f"SuperLink on {dep.host}:{dep.port} ({how}), {nodes} SuperNodes; PIDs in "
                  f"{Path(args.dir) / 'deployment.json'}; stop with `hetfed flower stop {args.dir}`", soft_wrap=True)
    return 0


def cmd_flower_stop(args: argparse.Namespace) -> int:
    from hetfed.flower.deploy import LocalDeployment

    dep = LocalDeployment.load(args.dir)
    n = len(dep.pids)
    dep.stop()
    console.print(f"stopped {n} processes of the deployment in {args.dir}", soft_wrap=True)
    return 0


def cmd_flower_run(args: argparse.Namespace) -> int:
    import os

    from hetfed.errors import RunError
    from hetfed.flower import require_flwr
    from hetfed.flower.deploy import (
        CONNECTION,
        LocalDeployment,
        flower_level,
        run_on_deployment,
        shown,
    )
    from hetfed.runs.plan import check_config, check_remote_resume
    from hetfed.runs.rundir import failure_reason

    require_flwr()
    if bool(args.deployment) == bool(args.connection):
        raise ConfigError("hetfed flower run needs exactly one of --deployment DIR (local) or --connection NAME "
                          "(remote)")
    if args.resume is not None:
        _resume_alone(args)
        from hetfed.runs.checkpoint import read_checkpoint
        from hetfed.runs.runner import resumable_config

        config, args.out = resumable_config(Path(args.resume)), args.resume
        check_remote_resume(read_checkpoint(args.resume))  # refused here, before anything is submitted
    else:
        # flower.* is read there
        config = load_config(args.config, args.sets, executor="deployment", methods=args.methods)
        check_config(config)  # refused here, before anything is submitted
        if args.out is None:
            raise ConfigError("hetfed flower run needs --out DIR (the run directory), or --resume RUN_DIR")
        if Path(args.out).exists():
            raise ConfigError(f"--out {args.out!r} already exists: choose a new directory (hetfed never overwrites a "
                              "run)")
    if args.deployment:
        dep = LocalDeployment.load(args.deployment)
        env, connection = dep.env(), CONNECTION
    else:
        env, connection = dict(os.environ), args.connection
    held: list[str] = []

    def relay(line: str) -> None:
        """hetfed's lines as they come; Flower's INFO chatter only in the log; from Flower's first error on, the
        lines are held: shown at the end only when the run itself does not say why it failed."""
        if not shown(line):
            return
        if held or flower_level(line) in ("ERROR", "CRITICAL") or line.startswith("Traceback"):
            held.append(line)
            return
        sys.stdout.write(line)
        sys.stdout.flush()

    done = run_on_deployment(config, args.out, env, connection, on_line=relay, resume=args.resume is not None,
                             report=not args.no_report)
    if done.returncode != 0 or not (Path(args.out) / SUMMARY).is_file():
        reason = failure_reason(Path(args.out))
        if reason:  # the ServerApp's own one-line error (its traceback is in the log)
            raise RunError(f"{reason} (run marked failed in {args.out}; Flower's output: {done.log})")
        sys.stdout.writelines(held)
        tail = " ".join(line for line in done.stdout.strip().splitlines()[-3:])
        raise RunError(f"the Flower run did not complete (flwr run exit {done.returncode}): {tail} (whole output: "
                       f"{done.log})")
    _no_report_line(args, Path(args.out))
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from hetfed.runs.plan import check_config

    config = load_config(args.config, args.sets, methods=args.methods)
    check_config(config)  # what would be refused at the plan, refused here
    console.print(dump_config(config), markup=False, highlight=False)
    return 0


def cmd_partition(args: argparse.Namespace) -> int:
    from hetfed.config import UnreadKey
    from hetfed.pipeline import unread_by_preparation
    from hetfed.runs.plan import check_config

    config = load_config(args.config, args.sets)
    fit_to_idle_cores(others=False)  # Γ gains from every core even beside busy ones, but not past a CPU quota
    check_config(config, train=False)  # partitioning trains no method's model
    for note in unread_by_preparation(config, args.sets):
        warnings.warn(note, UnreadKey, stacklevel=1)
    if args.plot:
        check_figure_path(args.plot)
    if args.nodes is not None and not args.export:
        raise ConfigError(f"--nodes {args.nodes} is not allowed without --export DIR: it says how many SuperNodes "
                          "the exported clients go to")
    if args.export:
        check_export(config, args.export, args.nodes)
    report = partition_report(config, status=err_console)  # progress goes to stderr
    fed, names = report.pop("_federation"), report.pop("_class_names")
    print_loading(err_console, report["data_notes"], report["warnings"])
    if args.export:
        written = export_nodes(config, fed, args.export, args.nodes, names)
        folder = Path(args.export)
        err_console.print(f"{len(written)} SuperNodes' files, {CONFIG_FILE} and {COMMANDS_FILE} written to "
                          f"{args.export} (docs/flower.md: a real federation of these clients); on this machine: "
                          f"hetfed flower start DEP --node-configs {folder / COMMANDS_FILE}, then hetfed flower run "
                          f"{folder / CONFIG_FILE} --deployment DEP --out RUN", soft_wrap=True, markup=False)
    if args.plot:
        from hetfed.analysis.figures import plot_partition

        plot_partition(fed, args.plot, seed=config.seed)
    if args.json:
        print(json.dumps(report))
        return 0
    print_partition(console, config, report)
    if args.plot:
        console.print(f"figure written to {args.plot}", soft_wrap=True)
    return 0


def _add_no_report(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-report", action="store_true",
                   help="draw no figures and no report.html (seconds a run: scripts running many); "
                        "`hetfed report DIR` draws them later from the directory")


def _no_report_line(args: argparse.Namespace, directory: Path) -> None:
    if args.no_report and not args.quiet:
        console.print(f"no figures or report.html (--no-report): `hetfed report {directory}` draws them",
                      soft_wrap=True)


def _resume_alone(args: argparse.Namespace) -> None:
    """``--resume RUN_DIR`` takes nothing that sets up a run: a resumed run uses its own config.yaml and directory."""
    given = [flag for flag, v in (("CONFIG", args.config), ("--set", args.sets), ("--methods", args.methods),
                                  ("--out", args.out)) if v]
    if given:
        raise ConfigError(f"--resume {args.resume!r} is not allowed with {', '.join(given)}: a resumed run uses "
                          "its own config.yaml and directory; expected --resume RUN_DIR alone")


def cmd_run(args: argparse.Namespace) -> int:
    from hetfed.analysis.present import present_run
    from hetfed.runs.runner import resume_experiment, run_experiment

    present = None if args.no_report else present_run

    if args.resume is not None:
        _resume_alone(args)
        fit_to_idle_cores()
        out = resume_experiment(args.resume, progress=not args.quiet, console=console, present=present)
    else:
        config = load_config(args.config, args.sets, methods=args.methods)
        fit_to_idle_cores()
        out = run_experiment(config, out=args.out, progress=not args.quiet, console=console, present=present)
    _no_report_line(args, out.run_dir)
    if args.quiet:  # no progress, but always where the results are
        console.print(f"run directory: {out.run_dir}", soft_wrap=True)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from hetfed.analysis.present import present_sweep
    from hetfed.config_io import parse_grid, refuse_swept_overrides
    from hetfed.runs.sweep import run_sweep

    config = load_config(args.config, args.sets, methods=args.methods)
    grid = parse_grid(args.grid)
    refuse_swept_overrides(grid, args.sets)
    if args.methods is not None and "methods" in grid:
        raise ConfigError(f"--grid methods is not allowed with --methods {','.join(args.methods)!r}: every grid "
                          "point's methods would replace the ones chosen; expected one of them")
    if args.dry_run:
        return _dry_run(config, grid, args)
    fit_to_idle_cores()
    sweep_dir, _ = run_sweep(config, grid, seeds=args.seeds, out=args.out, progress=not args.quiet, console=console,
                             present=None if args.no_report else present_sweep, resume=args.resume,
                             jobs=args.jobs, stack=args.stack, each_method=args.each_method)
    _no_report_line(args, sweep_dir)
    return 0


def _dry_run(config: Config, grid: dict[str, list[Any]], args: argparse.Namespace) -> int:
    """``hetfed sweep --dry-run``: each run's folder and fate (``--quiet``: the refused ones and the counts)."""
    from collections import Counter

    from hetfed.runs.sweep import dry_run

    runs = dry_run(config, grid, seeds=args.seeds, out=args.out, resume=args.resume, jobs=args.jobs,
                   stack=args.stack, each_method=args.each_method, status=None if args.quiet else err_console)
    width = max(len(str(folder)) for folder, _ in runs)
    for folder, fate in runs:
        if not args.quiet or fate.startswith("refused"):  # --quiet: the failures alone, as a sweep's
            console.print(f"{str(folder):<{width}}  {fate}", markup=False, soft_wrap=True)
    kinds = Counter(fate.split(":")[0] for _, fate in runs)
    fates = ", ".join(f"{n} {kind}" if kind == "refused" else f"{n} to {kind}" for kind, n in kinds.items())
    where = args.out if args.out is not None else f"a new folder in {config.out_dir}/"
    how = "stacked" if args.stack else f"in {args.jobs} processes" if args.jobs > 1 else "one at a time"
    console.print(f"dry run: {len(runs)} runs ({fates}; {how}) in {where}: checked, nothing trained or written",
                  markup=False, soft_wrap=True)
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from hetfed.analysis.merge import merge_sweeps
    from hetfed.runs.sweep_tables import print_table

    merged = merge_sweeps(args.dirs, args.out)
    for problem in merged.figure_problems:
        console.print(f"warning: not drawn: {problem}", style="yellow", soft_wrap=True)
    print_table(merged.table, merged.keys, console)
    if not merged.curves:
        console.print("note: curves.csv is not in every folder, so the merged folder has no learning curves",
                      style="yellow", soft_wrap=True)
    seeds = ", ".join(map(str, merged.seeds))
    console.print(f"merged {len(args.dirs)} sweeps (seeds {seeds}) into {merged.path} (report: "
                  f"{merged.path / 'report.html'})", soft_wrap=True)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from hetfed.analysis.report import write_report

    if args.out is not None and (Path(args.out).is_dir() or not Path(args.out).resolve().parent.is_dir()):
        raise ConfigError(f"--out {args.out!r} is not allowed: expected a file path in an existing folder, "
                          "e.g. report.html")
    try:
        path = write_report(args.dir, args.out)
    except OSError as err:
        if args.out is None or err.filename is None or Path(err.filename).parent != Path(args.out).resolve().parent:
            raise
        raise ConfigError(f"--out {args.out!r} cannot be written: {err.strerror}; expected a file path in a "
                          "writable folder") from err
    console.print(f"report: {path}", soft_wrap=True)
    return 0


def _raise_terminated(signum: int, _frame: object) -> None:
    raise Terminated(signum)


def _show_note(message, category, filename, lineno, file=None, line=None) -> None:
    """hetfed's notes (:class:`HetfedNote`) as one ``note:`` line on stderr; other warnings as Python shows them."""
    if issubclass(category, HetfedNote):
        err_console.print(f"note: {error_line(str(message))}", style="yellow", soft_wrap=True)
    else:
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def error_line(message: str) -> str:
    """One line: an error message may quote YAML or file text with newlines."""
    return " ".join(str(message).split())


def main(argv: Sequence[str] | None = None) -> int:
    global console, err_console
    console, err_console = make_console(), make_console(stderr=True)  # the streams of this call
    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # like Ctrl-C: the run is marked failed (only the main thread may set handlers)
        previous = signal.signal(signal.SIGTERM, _raise_terminated)
        # a process started in the background by a shell script inherits SIGINT as *ignored*: take it back,
        # so `kill -INT` stops hetfed there too (exit 130, the run marked failed)
        previous_int = signal.signal(signal.SIGINT, signal.default_int_handler)
    except ValueError:
        previous = previous_int = None
    try:
        with warnings.catch_warnings():
            warnings.showwarning = _show_note
            refuse_unknown()
            return args.func(args)
    except HetfedError as err:
        err_console.print(f"error: {error_line(str(err))}", style="bold red", soft_wrap=True)
        return 2
    except OSError as err:  # the machine's refusal (permissions, disk full): not a hetfed bug
        where = f" ({err.filename})" if err.filename else ""
        err_console.print(f"error: {err.strerror or err}{where}", style="bold red", soft_wrap=True)
        return 2
    except Terminated as err:
        err_console.print(str(err), soft_wrap=True)
        return 128 + err.signum
    except KeyboardInterrupt:
        err_console.print("interrupted")
        return 130
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)


def _forget_caught_interrupts() -> None:
    """Clear CPython's record of a Ctrl-C that ended a string ``exec``: :func:`main` has handled it.

    ``exec`` of a *string* (how dataclasses and ``namedtuple`` build their methods, in modules imported
    mid-run) notes a KeyboardInterrupt raised inside it in a flag that a later ``except`` does not clear;
    under ``python -m hetfed.cli`` the interpreter reads that flag at exit and kills itself with SIGINT, so
    the 130 that :func:`main` returned became -2 whenever the signal landed in such an ``exec`` (seen with
    strace). The flag is reset at the start of every string eval, and this one ends normally.
    """
    exec("")


def entry() -> None:
    """The ``hetfed`` command: :func:`main`, then exit — at once if a library left threads that would block it.

    After a SIGTERM or a failure during a Flower simulation, Flower's ServerApp thread can still be
    waiting for replies that will never come; Python would wait for it at exit. The run directory
    is already marked failed by then, so the process leaves without waiting.
    """
    import os
    import threading

    from hetfed.engine import host_threads

    host_threads.STARTED = host_threads.cpu_reading()  # what other processes do from now on (fit_to_idle_cores)
    code = main()
    _forget_caught_interrupts()
    stuck = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon and t.is_alive()]
    if code != 0 and stuck:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    entry()
