"""Where a training round's time goes: one case of ``benchmarks/engine.py`` under cProfile and torch.profiler.

Prints (as JSON) the round's seconds, the share of them inside the local steps (``train_stack``), the Python
functions with the most own time (cProfile), and the torch operators with the most host time and device time
(torch.profiler), with how many times the host waited on the device and, on CUDA, the lines of hetfed that made it
wait (``synchronisations_per_round_by_line``). For finding the work around the steps that a GPU round is bound by;
nothing is asserted.

    python benchmarks/profile_round.py [--case overhead_bound] [--device cpu|cuda] [--rounds 3] [--top 25]
                                       [--algorithm fedavg|fsnet|…]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time

import torch
from engine import CASES, _Synthetic  # this folder is on sys.path

from hetfed.algorithms import build_algorithm
from hetfed.config import ModelConfig, OptimizerConfig, PartitionConfig, TrainConfig
from hetfed.engine import local
from hetfed.executors.inprocess import VectorisedExecutor
from hetfed.executors.simulate import simulate
from hetfed.models import build_model
from hetfed.partition import make_federation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="overhead_bound", choices=list(CASES))
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--capture", default="auto", choices=["auto", "off", "compile"])
    ap.add_argument("--algorithm", default="fedavg", help="a registered algorithm with its default parameters")
    args = ap.parse_args()
    case = CASES[args.case]
    fed = make_federation(_Synthetic(case["clients"] * case["per_client"], case["d"]),
                          PartitionConfig(kind="iid", clients=case["clients"], val_fraction=0.0, test_fraction=0.0),
                          seed=0)
    model = build_model(ModelConfig(kind="mlp", hidden=case["hidden"]), fed.input_shape, fed.n_classes)
    train = TrainConfig(rounds=args.rounds, client_fraction=1.0, eval_every=10_000, device=args.device,
                        capture=args.capture, optimizer=OptimizerConfig(lr=0.01, momentum=0.0), **case["train"])
    algo = build_algorithm(args.algorithm, model, train, in_features=case["d"])
    warm = 12 if args.capture == "compile" else 1  # a compiled key compiles once enough rounds planned it
    simulate(algo, fed, train.model_copy(update={"rounds": warm}), 0, executor=VectorisedExecutor())  # warm-up

    inside = [0.0]
    real = local.train_stack

    def timed_stack(*a, **k):
        t0 = time.perf_counter()
        out = real(*a, **k)
        if args.device == "cuda":
            torch.cuda.synchronize()
        inside[0] += time.perf_counter() - t0
        return out

    local.train_stack = timed_stack
    import hetfed.algorithms.fedavg as fedavg
    fedavg.train_stack = timed_stack
    result = simulate(algo, fed, train, 0, executor=VectorisedExecutor())
    per_round = result.train_seconds / args.rounds
    steps_share = inside[0] / result.train_seconds

    profiler = cProfile.Profile()
    profiler.enable()
    simulate(algo, fed, train, 0, executor=VectorisedExecutor())
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.top)
    python_top = [line.strip() for line in text.getvalue().splitlines() if line.strip()[:1].isdigit()]

    activities = [torch.profiler.ProfilerActivity.CPU]
    if args.device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        simulate(algo, fed, train, 0, executor=VectorisedExecutor())
    events = prof.key_averages()
    host = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:args.top]
    waits = {e.key: e.count for e in events if "Synchronize" in e.key or "Memcpy" in e.key or "item" in e.key
             or "_local_scalar_dense" in e.key}
    out = {
        "case": args.case, "algorithm": args.algorithm, "device": args.device, "capture": args.capture,
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "seconds_per_round": per_round, "local_steps_share": steps_share,
        "host_waits_and_copies": waits,
        "torch_ops_by_host_ms": [(e.key, e.count, round(e.self_cpu_time_total / 1e3, 3)) for e in host],
        "python_by_own_time": python_top,
    }
    if args.device == "cuda":
        dev = sorted(events, key=lambda e: getattr(e, "self_device_time_total", 0), reverse=True)[:args.top]
        out["torch_ops_by_device_ms"] = [(e.key, e.count, round(getattr(e, "self_device_time_total", 0) / 1e3, 3))
                                         for e in dev]
        out["synchronisations_per_round_by_line"] = _synchronisations(algo, fed, train)
    print(json.dumps(out, indent=1))


def _synchronisations(algo, fed, train) -> dict[str, float]:
    """Where the rounds wait on the device (#74 item 3: none but the round's read-back should): each line of hetfed
    that made a synchronising CUDA call, and how many a round, under ``torch.cuda.set_sync_debug_mode("warn")``."""
    import collections
    import warnings

    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            simulate(algo, fed, train, 0, executor=VectorisedExecutor())
    finally:
        torch.cuda.set_sync_debug_mode("default")
    lines = collections.Counter(f"{w.filename.split('/src/')[-1]}:{w.lineno}" for w in seen
                                if "synchroniz" in str(w.message))
    return {line: count / train.rounds for line, count in lines.most_common()}


if __name__ == "__main__":
    main()
