"""The arithmetic a protocol needs, counted, and the least time a device can do it in (#74 §5: "the whole protocol in
≤ 10 minutes of one GPU").

For each method, the floating-point operations hetfed executes in one round of the protocol's config, counted by
torch's own counter (:class:`torch.utils.flop_counter.FlopCounterMode`: the matrix products and convolutions of every
forward and backward, as dispatched): a run of 2 rounds minus a run of 1 (loading, Γ and the final evaluation cancel),
split into the clients' training (the executor's ``train``), their evaluation (``evaluate``), their personal phase
(``personalise``) and the rest: the server's own work, its model scored on the global test set among it. Then the
protocol's total — ``--rounds`` rounds × ``--seeds`` seeds of each method — and the minutes a device sustaining each
of ``--tflops`` would need for it: a floor (no kernel reaches its device's peak; the elementwise work is not
counted). Nothing is timed but the counting runs themselves; nothing is asserted.

Counted on any device (a CPU is enough: the operations are the same); eager steps (``train.capture: off``: a counter
sees no operations inside a replayed recording). On PFLlib's protocol (``cnn4``) counting FedAvg takes ~2.5 min on a
2-core CPU (three rounds and two loadings), Per-FedAvg and Ditto ~5 each (``results/protocol_flops_2026-12-04``).

    python benchmarks/protocol_flops.py [--config configs/leaderboard_pfllib_fmnist.yaml] [--methods fedavg ditto]
                                        [--rounds 2000] [--seeds 3] [--tflops 67 495] [--threads 2]

``--tflops``'s defaults are an H200's dense peaks (NVIDIA's datasheet: FP32 67, TF32 tensor cores 495 without
sparsity): what the lent GPU could do at best.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import warnings
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

from hetfed.config import OverriddenKey, load_config
from hetfed.config_io import method_entries
from hetfed.executors.inprocess import InProcessExecutor
from hetfed.runs.runner import run_experiment

ROOT = Path(__file__).resolve().parents[1]
PARTS = ("train", "evaluate", "personalise")


def counted_run(config: str, method: str, rounds: int, out: Path) -> dict[str, float]:
    """FLOPs of one run of ``method`` for ``rounds`` rounds: in total and in the executor's ``PARTS``."""
    # the method as the protocol configures it (its parameters and own train settings, which change its arithmetic:
    # the protocol's Per-FedAvg trains two epochs a round), or the plain algorithm of that name
    entry = method_entries(config, [method], plain=True)[0]
    cfg = load_config(config, [f"train.rounds={rounds}", f"methods=[{json.dumps(entry)}]",
                               "train.capture=off", "train.device=cpu", "heterogeneity.iid_draws=0"])
    counter = FlopCounterMode(display=False)
    spent = dict.fromkeys(PARTS, 0)
    originals = {name: getattr(InProcessExecutor, name) for name in PARTS}

    def counted(name: str):
        fn = originals[name]

        def call(*args, **kwargs):
            before = counter.get_total_flops()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += counter.get_total_flops() - before
        return call

    for name in PARTS:
        setattr(InProcessExecutor, name, counted(name))
    try:
        with counter:
            run_experiment(cfg, out=out, progress=False)
    finally:
        for name, fn in originals.items():
            setattr(InProcessExecutor, name, fn)
    return {"total": counter.get_total_flops(), **spent}


def per_round(config: str, method: str, tmp: Path) -> dict[str, float]:
    """GFLOP of one round of ``method`` (2 rounds' run minus 1 round's), by part."""
    one, two = (counted_run(config, method, r, tmp / f"{method}_{r}") for r in (1, 2))
    diff = {k: (two[k] - one[k]) / 1e9 for k in one}
    parts = {"train_gflop": diff["train"], "evaluate_gflop": diff["evaluate"],
             "personalise_gflop": diff["personalise"],
             "server_and_other_gflop": diff["total"] - diff["train"] - diff["evaluate"] - diff["personalise"]}
    return {k: float(f"{v:.4g}") for k, v in {"round_gflop": diff["total"], **parts}.items()}


def main() -> None:
    warnings.filterwarnings("ignore", category=OverriddenKey)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "leaderboard_pfllib_fmnist.yaml"))
    ap.add_argument("--methods", nargs="+", default=["fedavg"])
    ap.add_argument("--rounds", type=int, default=2000, help="the protocol's rounds")
    ap.add_argument("--seeds", type=int, default=3, help="the protocol's seeds")
    ap.add_argument("--tflops", type=float, nargs="+", default=[67.0, 495.0],
                    help="device throughputs (TFLOP/s) to state the floor at")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods:
            rows[method] = per_round(args.config, method, Path(tmp))
            print(json.dumps({method: rows[method]}), flush=True)
    total = sum(row["round_gflop"] for row in rows.values()) * args.rounds * args.seeds / 1e6  # PFLOP
    print(json.dumps({
        "config": args.config, "rounds": args.rounds, "seeds": args.seeds, "methods": rows,
        "protocol_pflop": round(total, 2),
        "floor_minutes_at": {f"{t:g} TFLOP/s": round(total * 1e3 / t / 60, 1) for t in args.tflops},
        "tflops_needed_for_10_minutes": round(total * 1e3 / 600, 1),
        "torch": torch.__version__}, indent=2))


if __name__ == "__main__":
    main()
