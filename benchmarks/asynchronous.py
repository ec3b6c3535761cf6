"""Asynchronous and compressed FL against synchronous FedAvg, measured in one run on the same machine (#49).

1. **Async throughput**: client updates per second of training (evaluation excluded) of FedBuff and FedAsync on the
   vectorised executor against synchronous FedAvg with as many clients per round as the async runs keep training
   at once (``concurrency``), on the same synthetic federation; with a lognormal latency spread (clients sent the
   same version then arrive at different times) and without one; on the small model the async results use and
   an MNIST-sized one (where a client's training, not the server's per-arrival work, is most of an update).
   Also the mean stack the lazy trainer formed. The issue's target: async ≥ 0.8× synchronous.
2. **Compression overhead** on W1 (100 clients × 600 × 784, MLP 784-200-200-10, E = 1, B = 50): a FedAvg round with
   8-bit QSGD (and the other kinds) against the same round uncompressed. The target: ≤ 1.10× at 8 bits.

Prints JSON. Not a test: timings are never asserted.

    python benchmarks/asynchronous.py [--updates N] [--w1-rounds N] [--repeats R] [--threads T] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine import _Synthetic  # noqa: E402

from hetfed.algorithms import build_algorithm  # noqa: E402
from hetfed.config import ModelConfig, OptimizerConfig, PartitionConfig, ServerConfig, TrainConfig  # noqa: E402
from hetfed.executors import inprocess  # noqa: E402
from hetfed.executors.simulate import simulate  # noqa: E402
from hetfed.models import build_model  # noqa: E402
from hetfed.partition import make_federation  # noqa: E402


def _federation(clients: int, per_client: int, d: int):
    return make_federation(_Synthetic(clients * per_client, d),
                           PartitionConfig(kind="iid", clients=clients, val_fraction=0.0, test_fraction=0.0), seed=0)


def throughput(name: str, params: dict, fed, hidden: list[int], updates: int, clock: dict) -> dict:
    """Client updates per second of training, and the stacks the executor was given."""
    model = build_model(ModelConfig(kind="mlp", hidden=hidden), fed.input_shape, fed.n_classes)
    per_update = params.get("buffer", 1) if name != "fedavg" else params["clients_per_round"]
    rounds = max(1, updates // per_update)
    train = TrainConfig(rounds=rounds, eval_every=10_000, checkpoint_every=None, local_steps=10, batch_size=32,
                        optimizer=OptimizerConfig(lr=0.05, momentum=0.0), clock=clock, device=_DEVICE[0],
                        **({"clients_per_round": params["clients_per_round"]} if name == "fedavg" else {}))
    algo_params = {k: v for k, v in params.items() if k != "clients_per_round"}
    stacks: list[int] = []
    original, original_rows = inprocess.InProcessExecutor.train, inprocess.InProcessExecutor.train_rows

    def counting(self, bc, clients, reduce=False):
        stacks.append(len(clients))
        return original(self, bc, clients, reduce)

    def counting_rows(self, bc, clients, rounds):  # an asynchronous server's clients of several versions at once
        stacks.append(len(clients))
        return original_rows(self, bc, clients, rounds)

    inprocess.InProcessExecutor.train = counting  # type: ignore[method-assign]
    inprocess.InProcessExecutor.train_rows = counting_rows  # type: ignore[method-assign]
    try:
        simulate(build_algorithm(name, model, train.model_copy(update={"rounds": 2}), algo_params), fed,
                 train.model_copy(update={"rounds": 2}), 0)  # warm-up
        stacks.clear()
        result = simulate(build_algorithm(name, model, train, algo_params), fed, train, 0)
    finally:
        inprocess.InProcessExecutor.train = original  # type: ignore[method-assign]
        inprocess.InProcessExecutor.train_rows = original_rows  # type: ignore[method-assign]
    done = sum(stacks)
    return {"updates": done, "train_s": round(result.train_seconds, 3),
            "updates_per_s": round(done / result.train_seconds, 1), "mean_stack": round(float(np.mean(stacks)), 2),
            "sim_time": round(result.sim_time, 3)}


#: train.device of every run (``--device``)
_DEVICE = ["cpu"]


def _synchronised() -> None:
    """Wait for the device, so a timer around queued GPU work reads the work, not its launch."""
    if _DEVICE[0] == "cuda":
        torch.cuda.synchronize()


_SENDING = [0.0]  # seconds in Transport.send (the compressor's whole cost in process), over every call


def _timed_send() -> None:
    """Count the seconds the transport takes: what compression adds to a round, measured apart from the round's
    own time (which drifts by ±15 % between runs on this machine)."""
    from hetfed.server.transport import Transport

    send = Transport.send

    def timed(self, *a, **k):
        _synchronised()
        t0 = time.perf_counter()
        try:
            return send(self, *a, **k)
        finally:
            _synchronised()
            _SENDING[0] += time.perf_counter() - t0

    Transport.send = timed


def compression_round(fed, kind: dict, rounds: int) -> tuple[float, float]:
    """(train seconds per round, of which in the transport)."""
    _SENDING[0] = 0.0
    model = build_model(ModelConfig(kind="mlp", hidden=[200, 200]), fed.input_shape, fed.n_classes)
    train = TrainConfig(rounds=rounds, eval_every=10_000, checkpoint_every=None, local_epochs=1, batch_size=50,
                        optimizer=OptimizerConfig(lr=0.01, momentum=0.0), device=_DEVICE[0])
    algo = build_algorithm("fedavg", model, train, server=ServerConfig(compression=kind))
    result = simulate(algo, fed, train, 0)
    return result.train_seconds / rounds, _SENDING[0] / rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--updates", type=int, default=400, help="client updates per throughput measurement")
    ap.add_argument("--w1-rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3, help="interleaved repetitions (throughput, W1 rounds)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--parts", nargs="+", default=["throughput", "compression"], choices=["throughput", "compression"])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    _DEVICE[0] = args.device
    out: dict = {"device": args.device, "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
                 "threads": torch.get_num_threads()}

    m = 20
    workloads = {  # (inputs, hidden): the digits-sized model the async results use, and an MNIST-sized one
        "small_64d_mlp64x64": (64, [64, 64]),
        "mnist_784d_mlp200x200": (784, [200, 200]),
    }
    out["async_throughput"] = {"setting": f"100 clients x 200 samples, 10 local steps of B=32, concurrency {m} "
                               f"(FedBuff K={m // 2}); {args.repeats} interleaved repeats, medians"}
    for label, (d, hidden) in workloads.items() if "throughput" in args.parts else ():
        fed = _federation(100, 200, d)
        rows = {}
        for spread_name, clock in (("no_spread", {}), ("lognormal_1", {"latency": "lognormal", "spread": 1.0})):
            runs: dict[str, list[dict]] = {"fedavg_sync": [], "fedbuff": [], "fedasync": []}
            for _ in range(args.repeats):  # interleaved: this machine's speed drifts by ±30 % between minutes
                runs["fedavg_sync"].append(throughput("fedavg", {"clients_per_round": m}, fed, hidden, args.updates,
                                                      clock))
                runs["fedbuff"].append(throughput("fedbuff", {"concurrency": m, "buffer": m // 2}, fed, hidden,
                                                  args.updates, clock))
                runs["fedasync"].append(throughput("fedasync", {"concurrency": m}, fed, hidden, args.updates, clock))
            row: dict = {name: {"updates_per_s": float(np.median([r["updates_per_s"] for r in rs])),
                                "mean_stack": rs[-1]["mean_stack"], "sim_time": rs[-1]["sim_time"]}
                         for name, rs in runs.items()}
            for name in ("fedbuff", "fedasync"):  # the median of the repeats' own ratios (each pair measured together)
                row[f"{name}_over_sync"] = round(float(np.median([
                    a["updates_per_s"] / s["updates_per_s"] for a, s in zip(runs[name], runs["fedavg_sync"],
                                                                              strict=True)])), 3)
            rows[spread_name] = row
        out["async_throughput"][label] = rows

    if "compression" not in args.parts:
        print(json.dumps(out, indent=1))
        return
    w1 = _federation(100, 600, 784)
    kinds = {"none": {"kind": "none"}, "qsgd8": {"kind": "qsgd", "bits": 8}, "qsgd4": {"kind": "qsgd", "bits": 4},
             "topk1pct_ef": {"kind": "topk", "fraction": 0.01, "error_feedback": True}, "fp16": {"kind": "fp16"}}
    for kind in kinds.values():  # warm-up (QSGD's first call in a process loads its compiled kernel, ~0.5 s)
        compression_round(w1, kind, 1)
    _timed_send()
    samples: dict[str, list[float]] = {name: [] for name in kinds}
    sending: dict[str, list[float]] = {name: [] for name in kinds}
    for _ in range(args.repeats):  # interleaved: this machine's timings drift by ±30 % between minutes
        for name, kind in kinds.items():
            total, send = compression_round(w1, kind, args.w1_rounds)
            samples[name].append(total)
            sending[name].append(send)
    best = {k: min(v) for k, v in samples.items()}
    median = {k: float(np.median(v)) for k, v in samples.items()}
    none = median["none"] - float(np.median(sending["none"]))  # the round without its transport
    out["compression_w1"] = {"workload": "W1: 100 clients x 600 x 784, MLP 784-200-200-10, E=1, B=50, FedAvg",
                             "repeats": args.repeats,
                             "seconds_per_round_best": {k: round(v, 3) for k, v in best.items()},
                             "over_uncompressed_best": {k: round(v / best["none"], 3) for k, v in best.items()},
                             "over_uncompressed_median": {k: round(v / median["none"], 3) for k, v in median.items()},
                             "transport_s_per_round_median": {k: round(float(np.median(v)), 4)
                                                              for k, v in sending.items()},
                             # what the transport adds, over the uncompressed round without it: the issue's ratio
                             # measured on the work itself rather than as a difference of two noisy round times
                             "added_by_transport_median": {k: round(1 + float(np.median(v)) / none, 3)
                                                           for k, v in sending.items()}}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    t0 = time.perf_counter()
    main()
    print(f"# {time.perf_counter() - t0:.0f} s", file=sys.stderr)
