"""Stacked sweeps (#47 §5): a sweep of 1, 5 and 20 seeds run one by one and with ``--stack``, in one run.

The default experiment (digits, 10 feature-clustered clients, FedAvg on the ReLU MLP and CGAU, dropout 0.5),
``--rounds`` rounds. For each number of seeds: the sweep's wall time one run after another, with ``--stack``
(every run on a thread, each round's client steps of all runs as one stack), their ratio, and the largest
difference between the two runs.csv (the same numbers, to float tolerance). Timings are never asserted.

    python benchmarks/stacked_sweep.py [--rounds 20] [--seeds 1 5 20] [--threads 2] [--device cpu|cuda]
                                       [--stacked-only | --separate]

``--separate`` times what a user does without a sweep against the sweep, each as its own ``hetfed`` processes
(their starts and imports included, ``--rounds`` rounds, ``--threads`` as ``OMP_NUM_THREADS``): for each number
of seeds N, N separate ``hetfed run --set seed=s`` one after another, ``hetfed sweep --seeds N --stack`` and
``hetfed sweep --seeds N`` (#47's CPU target: 5 stacked seeds ≤ 0.5× five separate runs).

``--per-round`` measures what a round costs in stacked sweeps of each number of seeds: the marginal time of a round
(a sweep of ``--rounds`` rounds minus one of ``--rounds`` / 4, over the rounds between: preparation and start-up cancel
out), its ratio to one seed's (and each repeat's, ``over_one_seed_each_repeat``: the numbers of seeds take turns
within a repeat, so that each ratio is of one moment on a machine whose speed moves), what the sweep spends outside its
rounds a seed (``outside_rounds_ms_per_seed``: the short sweep's time outside the lockstep of its runs' rounds —
loading, partitioning and Γ, run directories, each method's final files and rows, summaries, the sweep's report), and
how much of the round the sweep's thread spends
computing the runs' joined client steps and evaluations (``joined_client_work_ms``), of which the joined stack's
step loop (``train_stack_ms``; the rest of the joined work: joining the runs' states and splitting their uploads,
screening, the evaluations; the rest of the round: each run's own server, evaluation summary, metrics and
checkpoints). The rest of the sweep thread's round, by
part: ``joined_evaluation_ms`` (of the joined work), ``runs_own_ms`` (the runs' own code between their requests:
their server chains' bookkeeping, metrics rows, checkpoints — what a run axis would make one call; of it
``metrics_rows_ms``, ``checkpoints_ms`` and ``progress_ms``: the rows written, the checkpoints serialised, the progress
display fed), ``alone_ms``
(requests answered run by run: a server's aggregation that does not join, as SCAFFOLD's), ``aggregations_ms``
(the servers' aggregations that join: FedAvg's chain for all runs in one call), ``server_scoring_ms``,
``summaries_ms`` and ``read_backs_ms`` (each one call for all runs), ``grouping_keys_ms`` (each request's key, which
groups the requests that share a computation), all within ``lockstep_ms`` (the sweep thread's whole lockstep; the
rest of the round is the runs' threads' own work and the hand-overs between threads). Each part's time is wall
time on the sweep's thread with a wrapper around its function (a few µs a call). ``--set`` overrides the experiment,
e.g. #74's CPU setting (logistic regression, 10 Dirichlet clients, evaluation every round)::

    python benchmarks/stacked_sweep.py --per-round --rounds 80 --seeds 1 5 20 --set model.kind=logreg \
        --set partition.kind=dirichlet --set partition.alpha=0.5 --set train.eval_every=1 \
        --set 'methods=[{name: fedavg, algorithm: fedavg}]'

``--methods fedavg,fedprox`` sweeps those algorithms as a grid instead (each run one method, side by side): what
runs of different methods share (their evaluations, servers' scoring and chains, where the same computation).

``--stacked-only`` times only the stacked sweeps (for #47's "20 stacked seeds ≤ 3× one seed's time" at a run's
full length, where running the seeds one by one as well would double the time): ``over_one_seed`` is each
sweep's time over the 1-seed stacked sweep's.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hetfed.config import OverriddenKey, load_config
from hetfed.console import make_console
from hetfed.runs.sweep import run_sweep

QUIET = make_console(stderr=True)  # the sweeps' own lines (their directories): stdout is the JSON alone

DEFAULT = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"


def _values(path: Path) -> dict[tuple, float]:
    with open(path / "runs.csv") as fh:
        return {(r["seed"], r["method"], r["metric"]): float(r["value"]) for r in csv.DictReader(fh)
                if "seconds" not in r["metric"]}


def timed_sweep(config, seeds: int, stack: bool, out: Path, grid: dict | None = None) -> float:
    t0 = time.perf_counter()
    run_sweep(config, grid or {}, seeds=seeds, out=out, progress=False, console=QUIET, stack=stack)
    return time.perf_counter() - t0


def timed_command(args: list[str], threads: int) -> float:
    """Wall seconds of one ``hetfed`` process (this interpreter's), its output discarded."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "from hetfed.cli import entry; entry()", *args], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - t0


def separate_against_sweeps(seeds: int, rounds: int, device: str, threads: int, tmp: Path) -> dict[str, float]:
    """N separate runs, one after another, against the stacked and the one-by-one sweep of N seeds: processes."""
    common = ["--set", f"train.rounds={rounds}", "--set", f"train.device={device}"]
    separate = sum(timed_command(["run", "--quiet", *common, "--set", f"seed={s}", "--out", str(tmp / f"run{s}")],
                                 threads) for s in range(seeds))
    sweep = ["sweep", str(DEFAULT), *common, "--seeds", str(seeds), "--quiet"]
    stacked = timed_command([*sweep, "--stack", "--out", str(tmp / "stacked")], threads)
    one = timed_command([*sweep, "--out", str(tmp / "one")], threads)
    a, b = _values(tmp / "one"), _values(tmp / "stacked")
    return {"separate_runs_s": round(separate, 2), "stacked_sweep_s": round(stacked, 2),
            "one_by_one_sweep_s": round(one, 2), "stacked_over_separate": round(stacked / separate, 3),
            "one_by_one_over_separate": round(one / separate, 3), "max_abs_diff": max(abs(a[k] - b[k]) for k in a)}


def per_round(config_overrides: list[str], seeds: list[int], rounds: int, tmp: Path,
              repeats: int = 2, methods: list[str] | None = None) -> dict[int, dict[str, Any]]:
    """Each number of seeds' marginal milliseconds per round (stacked), over one seed's, and where it goes: the
    joined client work (the runs' client steps and evaluations computed together), of which the step loop of the
    joined stack (``train_stack``: the client arithmetic and its bookkeeping), and the rest of the sweep thread's
    round by part (the module docstring names them). Each sweep timed ``repeats`` times, the fastest kept
    (1 where a GPU's lease is short); the numbers of seeds take turns within a repeat, and each repeat's own ratio
    to one seed is kept too (``over_one_seed_each_repeat``, sorted): on a machine whose speed moves between minutes,
    the ratio of sweeps timed a minute apart measures the machine, not the code. ``methods``: a grid of these
    algorithms, each run one of them, side by side (their runs' seeds × methods in the stack)."""
    grid = {"methods": [[{"algorithm": m}] for m in methods]} if methods else None
    from hetfed.algorithms import fedavg
    from hetfed.engine import local
    from hetfed.executors import stacked_runs
    from hetfed.runs import observers

    rendezvous, rounds_of = stacked_runs.Rendezvous, stacked_runs._Rounds
    # (owner, function, the columns its time counts in): the joined client work and its step loop, then where the
    # rest of the sweep thread's round goes (#74 item 1: what a run axis would make one call for all runs)
    joined, steps = "joined_client_work_ms", "train_stack_ms"
    targets = [(stacked_runs, "train_together", (joined,)),
               (local, "train_stack", (steps,)), (fedavg, "train_stack", (steps,)),
               (stacked_runs, "evaluate_together", (joined, "joined_evaluation_ms")),
               (rounds_of, "advance", ("runs_own_ms",)), (stacked_runs, "_alone", ("alone_ms",)),
               (stacked_runs, "_aggregate_together", ("aggregations_ms",)),
               (rendezvous, "score_together", ("server_scoring_ms",)),
               (stacked_runs, "_summarise_together", ("summaries_ms",)),
               (stacked_runs, "_read_back_together", ("read_backs_ms",)),
               *[(stacked_runs, key, ("grouping_keys_ms",)) for key in ("_train_key", "_aggregate_key",
                                                                         "_read_back_key", "_evaluation_key",
                                                                         "_score_key", "_summary_key")],
               # within the runs' own code: their metrics rows (formatting every value), checkpoints, progress
               (observers.MetricsObserver, "evaluated", ("metrics_rows_ms",)),
               (observers.MetricsObserver, "trained", ("metrics_rows_ms",)),
               (observers.CheckpointObserver, "checkpoint", ("checkpoints_ms",)),
               (observers.ProgressObserver, "round_done", ("progress_ms",)),
               (rendezvous, "lockstep", ("lockstep_ms",))]
    columns = list(dict.fromkeys(column for _owner, _name, counted in targets for column in counted))
    spent = dict.fromkeys(columns, 0.0)
    originals = [getattr(owner, name) for owner, name, _columns in targets]

    def timed(fn, counted):
        def call(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                took = time.perf_counter() - t0
                for column in counted:
                    spent[column] += took
        return call

    for (owner, name, counted), fn in zip(targets, originals, strict=True):
        setattr(owner, name, timed(fn, counted))
    short = max(1, rounds // 4)
    configs = {r: load_config(str(DEFAULT), [*config_overrides, f"train.rounds={r}"]) for r in (short, rounds)}
    # wall[n][r][k]; parts[n][r]: each column's time summed over the repeats; outside[n]: each short sweep's time
    # outside its lockstep (its runs' rounds at once)
    wall = {n: {r: [] for r in configs} for n in seeds}
    parts = {n: {r: dict.fromkeys(columns, 0.0) for r in configs} for n in seeds}
    outside: dict[int, list[float]] = {n: [] for n in seeds}
    marginal: dict[int, list[float]] = {n: [] for n in seeds}  # each repeat's seconds a round
    try:
        timed_sweep(configs[short], seeds[0], True, tmp / "warm", grid)  # the first sweep warms up (imports …)
        for k in range(repeats):  # the seed counts in turn within a repeat: each repeat's ratios from one moment
            for n in seeds:
                for r, config in configs.items():
                    spent.update(dict.fromkeys(columns, 0.0))
                    wall[n][r].append(timed_sweep(config, n, True, tmp / f"{n}_{r}_{k}", grid))
                    for column, t in spent.items():
                        parts[n][r][column] += t
                    if r == short:
                        outside[n].append(wall[n][r][-1] - spent["lockstep_ms"])
                marginal[n].append((wall[n][rounds][-1] - wall[n][short][-1]) / (rounds - short))
                print(json.dumps({"seeds": n, "repeat": k, "ms_per_round": round(marginal[n][-1] * 1000, 2)}),
                      file=sys.stderr, flush=True)  # kept if a time limit stops us
        out: dict[int, dict[str, Any]] = {}
        for n in seeds:
            measured = {r: {"ms_per_round": min(wall[n][r]), **{c: t / repeats for c, t in parts[n][r].items()}}
                        for r in configs}
            out[n] = {column: round((measured[rounds][column] - measured[short][column]) / (rounds - short) * 1000, 2)
                      for column in measured[rounds]}
            out[n]["outside_rounds_ms_per_seed"] = round(min(outside[n]) * 1000 / n, 1)
            print(json.dumps({"seeds": n, **out[n]}), file=sys.stderr, flush=True)
        for n, row in out.items():
            row["over_one_seed"] = round(row["ms_per_round"] / out[seeds[0]]["ms_per_round"], 2)
            ratios = sorted(a / b for a, b in zip(marginal[n], marginal[seeds[0]], strict=True))
            row["over_one_seed_each_repeat"] = [round(v, 2) for v in ratios]
    finally:
        for (owner, name, _columns), fn in zip(targets, originals, strict=True):
            setattr(owner, name, fn)
    return out


def client_floor_ms(config_overrides: list[str], seeds: int, repeats: int = 20, device: str = "cpu") -> float | None:
    """The floor of a stacked round's client work for ``seeds`` runs of a linear model (``model.kind: logreg``;
    None for any other): every client's steps of its own federation (the seeds' partitions, its plan's number of
    steps of batch B) written out as one stack per step over the clients still training (no autograd, each weight
    moved by one ``baddbmm_``: :func:`engine.written_out_step`), and one stacked forward over every run's pool
    (the evaluation's arithmetic). Synthetic values of the data's shapes; the fastest of ``repeats`` rounds."""
    from engine import written_out_step

    from hetfed.pipeline import build_federation

    config = load_config(str(DEFAULT), config_overrides)
    if config.model.kind != "logreg":
        return None
    train = config.train
    sizes, pool = [], 0
    for s in range(seeds):
        fed = build_federation(config.model_copy(update={"seed": s}), progress=False).federation
        sizes += [len(t) for t in fed.train]
        # what an evaluation scores: every client's train, validation and test rows, and the global test set
        pool = len(fed.x) + len(fed.x_global_test)
        d, k = int(np.prod(fed.input_shape)), fed.n_classes
    b = train.batch_size
    steps = sorted((max(1, round(train.local_epochs * -(-m // b))) for m in sizes if m), reverse=True)
    n = len(steps)
    params = [torch.zeros(n, d, k, device=device), torch.zeros(n, 1, k, device=device)]
    xb, yb = torch.randn(n, b, d, device=device), torch.randint(0, k, (n, b), device=device)
    xe = torch.randn(seeds, pool, d, device=device)
    active = [sum(1 for s in steps if s > t) for t in range(steps[0])]

    def one_round() -> float:
        t0 = time.perf_counter()
        for c in active:
            written_out_step([p[:c] for p in params], xb[:c], yb[:c], 0.01)
        torch.baddbmm(params[1][:seeds], xe, params[0][:seeds]).argmax(-1)
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    one_round()
    return round(min(one_round() for _ in range(repeats)) * 1000, 2)


def main() -> None:
    # the benchmark's own --set overrides (logreg in place of the default MLP) drop the default's keys on purpose:
    # the note a user gets for that, printed at every sweep here, is noise in the benchmark's output
    warnings.filterwarnings("ignore", category=OverriddenKey)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 5, 20])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--stacked-only", action="store_true")
    mode.add_argument("--separate", action="store_true")
    mode.add_argument("--per-round", action="store_true")
    ap.add_argument("--set", action="append", default=[], help="a config override (with --per-round)")
    ap.add_argument("--repeats", type=int, default=2, help="times each sweep is timed, the fastest kept (--per-round)")
    ap.add_argument("--methods", help="with --per-round: a sweep over these algorithms (comma-separated), side by side")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.per_round:
        with tempfile.TemporaryDirectory() as tmp:
            methods = args.methods.split(",") if args.methods else None
            rows = per_round([*args.set, f"train.device={args.device}"], args.seeds, args.rounds, Path(tmp),
                             args.repeats, methods)
        for n, row in rows.items() if not args.methods else ():  # the floor is of one method's runs
            floor = client_floor_ms(args.set, n, device=args.device)
            if floor is not None:
                row["client_floor_ms"] = floor
                row["client_floor_over_one_seed_round"] = round(floor / rows[args.seeds[0]]["ms_per_round"], 2)
        print(json.dumps({"experiment": "configs/default.yaml", "overrides": args.set, "methods": args.methods,
                          "rounds": args.rounds, "threads": args.threads, "device": args.device, "seeds": rows},
                         indent=2))
        return
    if args.separate:
        with tempfile.TemporaryDirectory() as tmp:
            rows = {n: separate_against_sweeps(n, args.rounds, args.device, args.threads, Path(tmp) / str(n))
                    for n in args.seeds}
        print(json.dumps({"experiment": "configs/default.yaml", "rounds": args.rounds, "threads": args.threads,
                          "device": args.device, "processes": True, "seeds": rows}, indent=2))
        return
    config = load_config(str(DEFAULT), [f"train.rounds={args.rounds}", f"train.device={args.device}"])
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for stack in (True,) if args.stacked_only else (False, True):  # the first sweeps pay imports, first device use
            timed_sweep(config, 1, stack, Path(tmp) / f"warm{stack}")
        for seeds in args.seeds:
            if args.stacked_only:
                rows[seeds] = {"stacked_s": round(timed_sweep(config, seeds, True, Path(tmp) / f"stacked{seeds}"), 2)}
                rows[seeds]["over_one_seed"] = round(rows[seeds]["stacked_s"] / rows[min(rows)]["stacked_s"], 2)
                continue
            one = timed_sweep(config, seeds, False, Path(tmp) / f"one{seeds}")
            stacked = timed_sweep(config, seeds, True, Path(tmp) / f"stacked{seeds}")
            a, b = _values(Path(tmp) / f"one{seeds}"), _values(Path(tmp) / f"stacked{seeds}")
            rows[seeds] = {"one_by_one_s": round(one, 2), "stacked_s": round(stacked, 2),
                           "stacked_over_one_by_one": round(stacked / one, 2),
                           "max_abs_diff": max(abs(a[k] - b[k]) for k in a)}
    print(json.dumps({"experiment": "configs/default.yaml", "rounds": args.rounds, "threads": args.threads,
                      "device": args.device,
                      "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None, "seeds": rows},
                      indent=2))


if __name__ == "__main__":
    main()
