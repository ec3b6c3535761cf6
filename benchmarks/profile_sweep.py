"""Where a sweep's time goes, on every thread: the default experiment's sweep (one by one or ``--stack``) under a
sampling profiler that reads every thread's stack each millisecond (``sys._current_frames``; cProfile sees only
the thread that started it, and a stacked sweep's runs are threads).

Prints JSON: the sweep's wall seconds, the samples taken, and for the functions seen most, the share of the
samples whose stack holds them (inclusive) and of those that end in them (own), over threads that were working
(a thread waiting on a lock, an event, a sleep or a C queue's ``get`` is not counted). Needs nothing but the standard
library and
hetfed, so it runs on a bare GPU machine; nothing is asserted.

    python benchmarks/profile_sweep.py [--seeds 5] [--rounds 10] [--stack] [--device cpu|cuda] [--top 40]
        [--config FILE] [--set KEY=VALUE …] [--grid KEY=V1,V2,… …]

The sweep is run once first for one round and one seed (imports, CUDA's start, cuDNN's choices: not profiled).

``--cprofile`` counts instead of sampling: cProfile on the thread that computes the rounds (a stacked sweep's
lockstep thread, ``Rendezvous.lockstep``; otherwise the sweep's own), each function's calls and its own and
inclusive seconds. Why: a sampler of ``sys._current_frames`` is biased to where threads give the GIL up (on a
20-run stacked sweep it put 9.7 % of the lockstep in metrics.csv's ``flush``, a ~1 µs call), and py-spy over a stacked
sweep's 21 threads fell minutes behind (2026-12-07). cProfile's own cost inflates small Python functions (~2× the
round); its counts are exact.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import json
import linecache
import pstats
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from hetfed.config import load_config
from hetfed.config_io import parse_grid
from hetfed.console import make_console
from hetfed.runs.sweep import run_sweep

QUIET = make_console(stderr=True)  # the sweeps' own lines (their directories): stdout is the JSON alone

DEFAULT = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"
#: frames a thread sits in while it waits (not working); ``submit``: a stacked run waiting for its turn (a lock
#: acquired in C, so no frame of its own)
WAITING = {"wait", "acquire", "_wait_for_tstate_lock", "sleep", "join", "select", "poll", "submit"}


def _name(frame: FrameType) -> str:
    code = frame.f_code
    return f"{Path(code.co_filename).name}:{code.co_name}"


#: source lines whose call waits inside C, with no frame of its own: the innermost frame is the caller's, on that
#: line (a stacked sweep's thread waiting for work: ``SimpleQueue.get`` is C)
BLOCKING_CALLS = ("_work.get()",)


def _blocked_in_c(frame: FrameType) -> bool:
    lineno = frame.f_lineno  # None for a frame that has not started its first line
    line = linecache.getline(frame.f_code.co_filename, lineno) if lineno is not None else ""
    return any(call in line for call in BLOCKING_CALLS)


class Sampler:
    """Every thread's stack but its own, every ``interval`` seconds, while running."""

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.inclusive: collections.Counter[str] = collections.Counter()
        self.own: collections.Counter[str] = collections.Counter()
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        me = threading.get_ident()
        while not self._stop.wait(self.interval):
            for ident, frame in sys._current_frames().items():
                if ident == me or frame.f_code.co_name in WAITING or _blocked_in_c(frame):
                    continue
                self.samples += 1
                self.own[_name(frame)] += 1
                seen = set()
                f: FrameType | None = frame
                while f is not None:
                    name = _name(f)
                    if name not in seen:
                        seen.add(name)
                        self.inclusive[name] += 1
                    f = f.f_back

    def table(self, top: int) -> dict[str, Any]:
        """The samples taken, and the top functions' shares of them: inclusive and own."""
        n = max(self.samples, 1)
        return {"samples": self.samples,
                "inclusive": {k: round(v / n, 4) for k, v in self.inclusive.most_common(top)},
                "own": {k: round(v / n, 4) for k, v in self.own.most_common(top)}}


class Counted:
    """cProfile on the thread that computes a sweep's rounds: a stacked sweep's lockstep thread (its
    ``Rendezvous.lockstep``, patched while within), else this one."""

    def __init__(self, stacked: bool) -> None:
        self.profile = cProfile.Profile()
        self.stacked = stacked

    def __enter__(self) -> Counted:
        if self.stacked:
            from hetfed.executors.stacked_runs import Rendezvous

            self._lockstep = original = Rendezvous.lockstep
            profile = self.profile

            def lockstep(rendezvous: Rendezvous, batch: Any) -> None:
                profile.enable()
                try:
                    original(rendezvous, batch)
                finally:
                    profile.disable()

            Rendezvous.lockstep = lockstep  # type: ignore[method-assign]
        else:
            self.profile.enable()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.stacked:
            from hetfed.executors.stacked_runs import Rendezvous

            Rendezvous.lockstep = self._lockstep  # type: ignore[method-assign]
        else:
            self.profile.disable()

    def table(self, top: int) -> dict[str, Any]:
        """Each of the top functions' calls, own and inclusive seconds, by own seconds and by inclusive."""
        stats = pstats.Stats(self.profile).stats  # type: ignore[attr-defined]
        rows = [(f"{Path(file).name}:{line}:{name}", calls, own, inclusive)
                for (file, line, name), (_primitive, calls, own, inclusive, _callers) in stats.items()]

        def best(key: int) -> dict[str, dict[str, float]]:
            ranked = sorted(rows, key=lambda r: r[key], reverse=True)[:top]
            return {r[0]: {"calls": r[1], "own_s": round(r[2], 4), "inclusive_s": round(r[3], 4)} for r in ranked}

        return {"counted_s": round(max((r[3] for r in rows), default=0.0), 3), "by_own": best(2),
                "by_inclusive": best(3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--stack", action="store_true")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("--config", default=str(DEFAULT), help="the experiment (default: configs/default.yaml)")
    ap.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE", help="as hetfed sweep's")
    ap.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...", help="as hetfed sweep's")
    ap.add_argument("--cprofile", action="store_true", help="count calls (cProfile) on the rounds' thread instead")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    sets = [*args.sets, f"train.device={args.device}"]
    config = load_config(args.config, [*sets, f"train.rounds={args.rounds}"])
    warm = load_config(args.config, [*sets, "train.rounds=1"])
    grid = parse_grid(args.grid)
    with tempfile.TemporaryDirectory() as tmp:
        run_sweep(warm, grid, seeds=1, out=Path(tmp) / "warm", progress=False, console=QUIET,
                  stack=args.stack)  # imports, CUDA
        t0 = time.perf_counter()
        with Counted(args.stack) if args.cprofile else Sampler() as profiler:
            run_sweep(config, grid, seeds=args.seeds, out=Path(tmp) / "sweep", progress=False, console=QUIET,
                      stack=args.stack)
        wall = time.perf_counter() - t0
    print(json.dumps({
        "seeds": args.seeds, "rounds": args.rounds, "config": args.config, "set": args.sets, "grid": args.grid,
        "stack": args.stack, "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None, "wall_s": round(wall, 3),
        **profiler.table(args.top),
    }, indent=1))

if __name__ == "__main__":
    main()
