"""``hetfed sweep --stack`` (#47 §5): a sweep's runs trained in one process as one stack of clients per round.

What a user relies on: the same runs.csv as running them one by one (3 seeds × 2 grid points that change the
partition and the proximal weight; the runs' rounds and evaluations each in one stack), each run's own directory and
checkpoints, a killed stacked sweep resumed
to the uninterrupted numbers, and clear refusals where stacking cannot apply.
"""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hetfed.cli import main
from hetfed.executors import stacked_runs, stacked_work

REPO = Path(__file__).resolve().parents[2]
#: FedAvg's ReLU MLP and CGAU (dropout 0.5), FedProx, Ditto and kNN-Per: every round (and evaluation) of a seed
#: stacks with the others'
BASE = ["sweep", str(REPO / "configs" / "default.yaml"), "--set", "train.rounds=4", "--set", "partition.clients=5",
        "--set", "methods=[{name: relu, algorithm: fedavg, model: {kind: mlp, dropout: 0.5}}, {name: cgau, algorithm: "
        "fedavg, model: {kind: cgau, dropout: 0.5}}, {name: prox, algorithm: fedprox, params: {mu: 0.1}}, "
        "{name: ditto, algorithm: ditto, params: {lam: 0.5}}, {name: knn, algorithm: knnper}]",
        "--grid", "partition.shuffle=0,0.5", "--seeds", "3", "--quiet"]
#: benchmarks/gpu.sh runs the tests that add these on a lent GPU (HETFED_TEST_DEVICE=cuda)
DEVICE = ["--set", f"train.device={os.environ['HETFED_TEST_DEVICE']}"] if os.environ.get("HETFED_TEST_DEVICE") else []
BASE[2:2] = DEVICE
ON_CPU = os.environ.get("HETFED_TEST_DEVICE", "cpu") == "cpu"


#: runs.csv's values that are continuous functions of the clients' updates or losses (not of counts): to float
#: tolerance, as metrics.csv's losses — a joined stack computes them in blocks of other shapes (FLTrust's trust shares
#: have differed by 1e-11 relative; on an AMD EPYC, AVX2, Agnostic FL's λ, ``findings.*``, by 1e-11 too, every other
#: value of every method equal)
CONTINUOUS = {"defence.attack_weight"}
CONTINUOUS_PREFIXES = ("findings.",)
#: the clients' validation loss of the best and the last model: a mean of float32 cross-entropies, whose logits a
#: joined evaluation computes in blocks of other shapes (on an AMD EPYC, AVX2, they differed by up to 5e-9 relative —
#: a tenth of a float32 ulp — while the accuracies, argmaxes of the same logits, and the choice of the best round
#: were equal): to float32's tolerance
FLOAT32_LOSSES = {"best.val_loss", "final.val_loss"}


#: on a GPU a stacked step computes in other kernels (grouped convolutions, blocks of other shapes) than a run's
#: own, so its numbers equal the one-by-one run's to float tolerance only, and an argmax over logits equal to float
#: tolerance may fall the other way: an accuracy may move by a flipped prediction or two (one of a 4-client test of
#: ~30 samples a client moves its worst client's accuracy by 1/29) while every loss still agrees to 1e-5
FLIPPED = 0.07


def _same(key: tuple, stacked: float, alone: float) -> bool:
    """Whether a stacked value is the one-by-one value: exactly on a CPU (the continuous ones to float tolerance),
    to float tolerance on a GPU, where an accuracy may also differ by a flipped prediction (:data:`FLIPPED`)."""
    if math.isnan(stacked) or math.isnan(alone):
        return math.isnan(stacked) and math.isnan(alone)
    if key[-1] in FLOAT32_LOSSES:
        return math.isclose(stacked, alone, rel_tol=1e-6 if ON_CPU else 1e-5, abs_tol=1e-8)
    if ON_CPU:
        continuous = key[-1] in CONTINUOUS or key[-1].startswith(CONTINUOUS_PREFIXES)
        return stacked == alone or (continuous and math.isclose(stacked, alone, rel_tol=1e-9, abs_tol=1e-12))
    if "accuracy" in key[-1]:
        return abs(stacked - alone) <= FLIPPED
    return math.isclose(stacked, alone, rel_tol=1e-5, abs_tol=1e-6)


def _equal(stacked: dict[tuple, float], alone: dict[tuple, float]) -> None:
    """#74: a stacked sweep's values are the one-by-one sweep's exactly on a CPU (the continuous ones to float
    tolerance), to float tolerance on a GPU; a failure lists every value that differs (a GPU's runs stay on it)."""
    assert stacked.keys() == alone.keys()
    differ = {key: (stacked[key], value) for key, value in alone.items() if not _same(key, stacked[key], value)}
    assert not differ, f"{len(differ)} values differ (stacked, one by one): {differ}"


def _ran(argv: list[str]) -> None:
    """``hetfed sweep`` exits 0; if not, the failure names each failed run's error (a GPU's failures stay on it)."""
    code = main(argv)
    record = Path(argv[argv.index("--out") + 1]) / "sweep.json"
    assert code == 0, json.loads(record.read_text())["failed"] if record.exists() else code


def _runs(path: Path, grid: tuple[str, ...] = ("partition.shuffle",), failing: bool = False) -> dict[tuple, float]:
    """runs.csv keyed by the ``grid`` keys' values, seed, method and metric (timings left out); a sweep with a failed
    run fails here with each one's reason unless ``failing`` (on a lent GPU three stacked runs under attack failed,
    their reasons left on the machine)."""
    statuses = {p.parent: json.loads(p.read_text()) for p in path.rglob("status.json")}
    failed = {str(d.relative_to(path)): s.get("reason") for d, s in statuses.items() if s.get("status") == "failed"}
    assert failing or not failed, failed
    with open(path / "runs.csv") as fh:
        rows = list(csv.DictReader(fh))
    return {(*(r.get(k) for k in grid), r["seed"], r["method"], r["metric"]): float(r["value"]) for r in rows
            if "seconds" not in r["metric"]}


def test_a_stacked_sweep_gives_the_runs_of_a_sweep_run_one_by_one(tmp_path, monkeypatch):
    served: list[int] = []
    scored: list[int] = []
    original, scoring = stacked_runs.train_together, stacked_runs.evaluate_together
    monkeypatch.setattr(stacked_runs, "train_together", lambda group: served.append(len(group)) or original(group))
    monkeypatch.setattr(stacked_runs, "evaluate_together", lambda group: scored.append(len(group)) or scoring(group))
    servers: list[int] = []  # the runs whose servers' models were scored in one forward
    forward = stacked_runs.evaluate_servers
    monkeypatch.setattr(stacked_runs, "evaluate_servers",
                        lambda algos, *a: servers.append(len(algos)) or forward(algos, *a))
    built: list[bool] = []  # whether each joined pool was built anew (not kept): once per set of runs, not per round
    joining = stacked_work._joint_pool

    def joint_pool(executors, cache, part=None):
        before = dict(cache)
        out = joining(executors, cache, part)
        built.append(cache != before)
        return out

    monkeypatch.setattr(stacked_work, "_joint_pool", joint_pool)
    _ran([*BASE, "--out", str(tmp_path / "one_by_one")])
    _ran([*BASE, "--out", str(tmp_path / "stacked"), "--stack"])
    assert len(built) > 40 and sum(built) <= 5 * 3  # per method (5): its train pools and global sets, and the group
    alone, stacked = _runs(tmp_path / "one_by_one"), _runs(tmp_path / "stacked")
    assert len(alone) > 100
    _equal(stacked, alone)
    assert max(served) == 6  # every run's round in one stack (6 runs, same client step)
    assert max(scored) == 6  # and every run's evaluation: each client on its own run's sets (the numbers above)
    assert max(servers) == 6  # and every run's server model on its global test set
    for run in (tmp_path / "stacked").glob("*/seed=*"):  # each run keeps its own directory
        assert (run / "summary.json").is_file() and (run / "checkpoints" / "relu-final.pt").is_file()


def test_stacking_refuses_jobs_and_executors_out_of_this_process(capsys):
    assert main([*BASE, "--stack", "--jobs", "2"]) == 2
    assert "--stack with --jobs 2 is not allowed" in capsys.readouterr().err
    assert main([*BASE, "--stack", "--set", "train.executor=flower"]) == 2
    err = capsys.readouterr().err
    assert "train.executor = 'flower'" in err and "cannot be stacked" in err


def test_a_failing_run_does_not_hang_the_others(tmp_path, monkeypatch):
    """A run whose client step raises fails alone: the runs stacked with it fail with the error instead of waiting
    forever, and the sweep reports them."""
    def broken(group):
        raise RuntimeError("injected")
    monkeypatch.setattr(stacked_runs, "train_together", broken)
    code = main([*BASE[:-5], "--seeds", "2", "--quiet", "--stack", "--out", str(tmp_path / "s")])
    assert code != 0


def test_runs_that_stop_at_different_rounds_step_together_while_they_last(tmp_path):
    """The lockstep goes on with the runs still training: runs of different lengths, and runs that stop early
    (patience) at different evaluations, give the numbers of the sweep without --stack, to the bit."""
    args = ["sweep", str(REPO / "configs" / "default.yaml"), "--set", "partition.clients=4", "--set",
            "train.patience=1", "--set", "train.local_steps=2", "--grid", "train.rounds=3,9", "--grid",
            "train.optimizer.lr=0.05,3.0", "--seeds", "2", "--quiet", "--set",
            "methods=[{name: fedavg, algorithm: fedavg}, {name: prox, algorithm: fedprox, params: {mu: 0.1}}]"]
    _ran([*args, "--out", str(tmp_path / "alone")])
    _ran([*args, "--stack", "--out", str(tmp_path / "stacked")])
    grid = ("train.rounds", "train.optimizer.lr")
    alone = _runs(tmp_path / "alone", grid)
    assert {v for k, v in alone.items() if k[-1] == "best_round"} >= {1.0, 3.0, 9.0}  # lr 3.0: stopped at 2, 4, 5
    _equal(_runs(tmp_path / "stacked", grid), alone)


def _rejected(path: Path) -> list[tuple[str, str, str]]:
    """Every run's rounds' rejected-by-norm counts, from its metrics.csv."""
    return sorted((run.parent.name + run.name, r["round"], r["value"]) for run in path.glob("*/seed=*")
                  for r in csv.DictReader(open(run / "metrics.csv")) if r["metric"] == "clients_rejected_norm")


def test_the_runs_screens_measured_in_one_pass_reject_the_clients_each_rejects_alone(tmp_path, monkeypatch):
    """A stacked round measures every run's updates (finite, norm against its own broadcast) in one pass; a tight
    norm filter then rejects, round by round, the clients the runs reject one by one, with the same numbers."""
    measured: list[int] = []
    real = stacked_work.measure
    monkeypatch.setattr(stacked_work, "measure",
                        lambda upload, *a, **k: measured.append(len(upload.client_ids)) or real(upload, *a, **k))
    args = ["sweep", str(REPO / "configs" / "default.yaml"), "--set", "partition.clients=6", "--set",
            "train.rounds=4", "--set", "server.screen.norm_factor=1.1", "--set", "partition.kind=dirichlet",
            "--seeds", "3", "--quiet", "--set", "methods=[{name: fedavg, algorithm: fedavg}]"]
    _ran([*args, "--out", str(tmp_path / "alone")])
    _ran([*args, "--stack", "--out", str(tmp_path / "stacked")])
    assert measured and max(measured) == 18  # three runs' six clients at once
    rejected = _rejected(tmp_path / "alone")
    assert sum(int(float(v)) for *_, v in rejected) > 0  # the filter bites
    assert _rejected(tmp_path / "stacked") == rejected
    _equal(_runs(tmp_path / "stacked", ()), _runs(tmp_path / "alone", ()))


def test_a_run_that_diverges_fails_alone_and_the_others_finish_as_without_stack(tmp_path):
    """A run's own error (its training diverges) ends that run only: the others' rounds go on in the lockstep, and
    their numbers are those of the sweep without --stack."""
    args = ["sweep", str(REPO / "configs" / "default.yaml"), "--set", "partition.clients=4", "--set",
            "train.rounds=4", "--grid", "train.optimizer.lr=0.05,1e38", "--seeds", "2", "--quiet"]
    for out in ("alone", "stacked"):
        main([*args, *(["--stack"] if out == "stacked" else []), "--out", str(tmp_path / out)])
        failed = json.loads((tmp_path / out / "sweep.json").read_text())["failed"]
        assert len(failed) == 2 and all("diverged" in f["error"] for f in failed), failed
    alone = _runs(tmp_path / "alone", ("train.optimizer.lr",), failing=True)
    assert alone and {k[0] for k in alone} == {"0.05"}
    _equal(_runs(tmp_path / "stacked", ("train.optimizer.lr",), failing=True), alone)


WRAPPER = r"""
import os, sys, time
from hetfed.executors import stacked_runs
original = stacked_runs.train_together
def slow(group):
    out = original(group)
    time.sleep(0.02)
    return out
stacked_runs.train_together = slow
from hetfed.cli import main
sys.exit(main([*sys.argv[1:], "--no-report"]))  # nothing here looks at the figures
"""


@pytest.mark.slow
def test_a_killed_stacked_sweep_resumes_to_the_uninterrupted_numbers(tmp_path):
    args = [*BASE[:-5], "--grid", "partition.shuffle=0,0.5", "--seeds", "2", "--quiet", "--set", "train.rounds=12",
            "--set", "train.checkpoint_every=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-c", WRAPPER, *args, "--stack", "--out", str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    t0 = time.monotonic()
    while not list(out.glob("*/seed=*/checkpoints/resume.pt")):
        assert proc.poll() is None, proc.stderr.read()
        assert time.monotonic() - t0 < 120, "no checkpoint was written"
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (out / "runs.csv").exists()
    resumed = subprocess.run([sys.executable, "-c", WRAPPER, *args, "--stack", "--resume", "--out", str(out)],
                             env=env, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    _ran([*args, "--out", str(tmp_path / "ref")])
    ref, got = _runs(tmp_path / "ref"), _runs(out)
    assert ref.keys() == got.keys()
    for key, value in ref.items():
        assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key


def test_the_api_stacks_a_sweep_too(tmp_path):
    import hetfed

    config = {"train": {"rounds": 2}, "partition": {"clients": 4}}
    grid = {"partition.shuffle": [0.0, 1.0]}
    alone = hetfed.sweep(config, grid, seeds=2, out=tmp_path / "a").values()
    stacked = hetfed.sweep(config, grid, seeds=2, out=tmp_path / "b", stack=True).values()
    numbers = [c for c in alone.columns if c == "value"]
    assert len(alone) == len(stacked) > 0 and numbers
    keep = ~alone["metric"].str.contains("seconds")
    assert (alone[keep]["value"] - stacked[keep]["value"]).abs().max() < 1e-6


def test_every_client_computation_runs_on_the_sweeps_thread_and_the_process_keeps_its_threads(tmp_path, monkeypatch):
    """The joined steps, evaluations and a run's personal phase run on the thread that started the sweep, with its
    torch threads; the runs' own threads compute on one (torch's CPU pool belongs to the thread that calls it:
    runs that each drove a pool of their own left it spinning on the others' cores, and a second thread's pool
    runs slower beside the first's). Afterwards a new thread gets the process's number of torch threads."""
    import threading

    import torch

    from hetfed.executors.inprocess import InProcessExecutor

    seen: dict[str, set[tuple[str, int]]] = {"train": set(), "evaluate": set(), "personalise": set(), "run": set()}

    def where(kind):
        seen[kind].add((threading.current_thread().name, torch.get_num_threads()))

    original, scoring = stacked_runs.train_together, stacked_runs.evaluate_together
    personalise, join = InProcessExecutor.personalise, stacked_runs.Rendezvous.join
    monkeypatch.setattr(stacked_runs, "train_together", lambda group: where("train") or original(group))
    monkeypatch.setattr(stacked_runs, "evaluate_together", lambda group: where("evaluate") or scoring(group))
    monkeypatch.setattr(InProcessExecutor, "personalise",
                        lambda self, *a, **k: where("personalise") or personalise(self, *a, **k))
    monkeypatch.setattr(stacked_runs.Rendezvous, "join", lambda self: join(self) or where("run"))
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        args = [*BASE[:-5], "--seeds", "2", "--quiet", "--stack", "--out", str(tmp_path / "s"), "--set",
                "methods=[{name: relu, algorithm: fedavg}, {name: babu, algorithm: fedbabu}]"]
        assert main(args) == 0
        me = threading.current_thread().name
        assert seen["train"] == seen["evaluate"] == seen["personalise"] == {(me, 2)}
        assert {n for _name, n in seen["run"]} == {1} and len(seen["run"]) == 2
        assert not {name for name, _n in seen["run"]} & {me}
        later: list[int] = []
        fresh = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        fresh.start()
        fresh.join()
        assert later == [2] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)


def test_a_stacked_sweep_compresses_each_runs_uploads_as_alone(tmp_path, monkeypatch):
    """Compression in a stacked sweep: each run's clients' uploads go through the run's own transport (QSGD's draws
    from each client's seed, top-k's error-feedback residuals kept in the run's own client states), so runs.csv is
    the one-by-one sweep's, bytes included; the runs still step as one stack."""
    served: list[int] = []
    original = stacked_runs.train_together
    monkeypatch.setattr(stacked_runs, "train_together", lambda group: served.append(len(group)) or original(group))
    methods = ("methods=[{name: q4, algorithm: fedavg, server: {compression: {kind: qsgd, bits: 4}}}, "
               "{name: top_ef, algorithm: fedavg, server: {compression: {kind: topk, fraction: 0.1, "
               "error_feedback: true}}}, {name: ditto_q8, algorithm: ditto, server: {compression: {kind: qsgd, "
               "bits: 8, bucket: 64}}}]")
    args = [*BASE[:-5], "--grid", "partition.shuffle=0.5", "--seeds", "3", "--quiet", "--set", methods]
    _ran([*args, "--out", str(tmp_path / "one_by_one")])
    _ran([*args, "--stack", "--out", str(tmp_path / "stacked")])
    alone, stacked = _runs(tmp_path / "one_by_one"), _runs(tmp_path / "stacked")
    assert alone.keys() == stacked.keys()
    for key, value in alone.items():
        assert stacked[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert max(served) == 3
    for run in (tmp_path / "one_by_one").glob("*/seed=*"):  # the compressed bytes each round sent
        sent = [_bytes(run / "metrics.csv"), _bytes(tmp_path / "stacked" / run.parent.name / run.name / "metrics.csv")]
        assert sent[0] == sent[1] and len(sent[0]) > 10 and len({v for (m, *_), v in sent[0].items()
                                                                 if m == "q4"} - {0.0}) > 0


def _metrics(path: Path) -> dict[tuple, float]:
    """Every run's metrics.csv: each value but the timings, keyed by run, method, round, split, client and metric."""
    out = {}
    for run in sorted(path.glob("*/seed=*")):
        with open(run / "metrics.csv") as fh:
            for r in csv.DictReader(fh):
                if r["value"] != "" and not any(t in r["metric"] for t in ("seconds", "_s", "time", "rate")):
                    out[(run.name, r["method"], r["round"], r["split"], r["client"], r["metric"])] = float(r["value"])
    return out


def _bytes(path: Path) -> dict[tuple, float]:
    with open(path) as fh:
        return {(r["method"], r["round"], r["metric"]): float(r["value"]) for r in csv.DictReader(fh)
                if "bytes" in r["metric"]}


@pytest.mark.slow
def test_every_registered_algorithm_runs_through_stack_with_the_numbers_of_the_sweep_without_it(tmp_path, capsys,
                                                                                                 monkeypatch):
    """#72 §4: every algorithm either stacks with the other runs or steps alone — never a crash — and runs.csv is
    the sweep's without --stack, to the bit on a CPU, evaluated every round; every algorithm that declares
    ``stacks_runs`` trains and evaluates its seeds' clients in one stack (#74), FedGen's, Fed-FSNet's, FedDF's,
    pFedHN's and pFedLA's servers fit their generators, hidden models, students and hypernetworks in one call, and
    every method whose server is the chain alone steps its runs' chains in one call; an
    asynchronous one is refused in one line."""
    import json

    from hetfed.registry import registry_of

    ALGORITHMS = registry_of("algorithm")
    joined: dict[str, set[tuple[str, int]]] = {}
    for name in ("train_together", "evaluate_together", "_aggregate_together"):
        computed = getattr(stacked_runs, name)

        def together(group, computed=computed, name=name):
            joined.setdefault(group[0].executor.algo.spec.name, set()).add((name, len(group)))
            return computed(group)

        monkeypatch.setattr(stacked_runs, name, together)

    from tests.feature_methods import reads_features

    names = [n for n, spec in ALGORITHMS.items() if not spec.capabilities.asynchronous and reads_features(n)]
    assert len(names) >= 38
    methods = [{"name": f"{n}_", "algorithm": n, "params": dict(ALGORITHMS.get(n).quick),
                **({"model": dict(ALGORITHMS.get(n).model)} if ALGORITHMS.get(n).model else {})} for n in names]
    args = ["sweep", str(REPO / "configs" / "default.yaml"), *DEVICE, "--set", "train.rounds=2", "--set",
            "partition.clients=4", "--set", "train.local_steps=2", "--set", "heterogeneity.iid_draws=0",
            "--set", "train.eval_every=1",
            "--set", f"methods={json.dumps(methods)}", "--seeds", "2", "--quiet"]
    _ran([*args, "--out", str(tmp_path / "one_by_one")])
    _ran([*args, "--out", str(tmp_path / "stacked"), "--stack"])
    alone, stacked = _runs(tmp_path / "one_by_one"), _runs(tmp_path / "stacked")
    assert {k[2].split("_")[0] for k in alone} >= {n.split("_")[0] for n in names}
    _equal(stacked, alone)
    # every value of every run's metrics.csv, each round's losses included, to float tolerance (not to the bit: the
    # joined stacks pad batches and evaluation blocks to other widths; the largest difference seen was 1.5e-7)
    per_round, joined_rounds = _metrics(tmp_path / "one_by_one"), _metrics(tmp_path / "stacked")
    assert per_round.keys() == joined_rounds.keys() and len(per_round) > 5000
    for key, value in per_round.items():
        assert joined_rounds[key] == pytest.approx(value, rel=1e-5, abs=1e-8, nan_ok=True), key
    stacking = {n for n in names if ALGORITHMS.get(n).capabilities.stacks_runs}
    assert len(stacking) >= 36 and {"scaffold", "fedgen", "fsnet", "cfl", "ifca", "fedcac", "fedpac"} <= stacking
    clients = {("train_together", 2), ("evaluate_together", 2)}
    assert {n for n in stacking if joined.get(n, set()) - {("_aggregate_together", 2)} != clients} == set()
    # servers that compute along the run axis aggregate their runs in one call: those five, and every method whose
    # server is the server chain alone (Algorithm.aggregate: FedAvg's, FedProx's, Ditto's …); one that changes its
    # aggregation without a run-axis form of it aggregates alone
    from hetfed.interface import Algorithm

    chain_alone = {n for n in stacking if ALGORITHMS.get(n).cls.aggregate is Algorithm.aggregate}
    assert {"fedavg", "fedprox", "ditto"} <= chain_alone and not {"scaffold", "fednova", "local"} & chain_alone
    along = {"fedgen", "fsnet", "feddf", "pfedhn", "pfedla"} | chain_alone
    assert {n for n in joined if ("_aggregate_together", 2) in joined[n]} == along
    assert not set(joined) - stacking  # the others step alone
    asynchronous = next(n for n, spec in ALGORITHMS.items() if spec.capabilities.asynchronous)
    capsys.readouterr()
    assert main([*args[:-5], "--set", f"methods=[{{algorithm: {asynchronous}}}]", "--seeds", "2", "--stack"]) == 2
    assert "cannot be stacked across runs" in capsys.readouterr().err


def test_methods_whose_server_sends_more_than_a_model_join_with_each_clients_own_runs_part(tmp_path, monkeypatch):
    """#74 §1: SCAFFOLD's control variate, FedProto's prototypes (a tensor and a per-class flag), FedDBE's number
    "known" with its global mean, and FedFomo's personal rows are each run's own; stacked, each client trains and is
    scored with its own run's (the seeds differ in them), in one stack per round, and runs.csv and every value of
    metrics.csv are the one-by-one sweep's to the bit (to 1e-5 on a GPU)."""
    served: list[tuple[str, str, int]] = []
    for name in ("train_together", "evaluate_together"):
        computed = getattr(stacked_runs, name)
        monkeypatch.setattr(stacked_runs, name, lambda group, computed=computed, name=name: served.append(
            (group[0].executor.algo.spec.name, name, len(group))) or computed(group))
    methods = "methods=[{algorithm: scaffold}, {algorithm: fedproto}, {algorithm: feddbe}, {algorithm: fedfomo}]"
    args = ["sweep", str(REPO / "configs" / "default.yaml"), *DEVICE, "--set", "train.rounds=3", "--set",
            "partition.clients=4", "--set", "train.local_steps=2", "--set", "heterogeneity.iid_draws=0", "--set",
            "train.eval_every=1", "--set", methods, "--seeds", "2", "--quiet"]
    _ran([*args, "--out", str(tmp_path / "one_by_one")])
    _ran([*args, "--stack", "--out", str(tmp_path / "stacked")])
    _equal(_runs(tmp_path / "stacked", ()), _runs(tmp_path / "one_by_one", ()))
    _equal(_metrics(tmp_path / "stacked"), _metrics(tmp_path / "one_by_one"))
    for method in ("scaffold", "fedproto", "feddbe", "fedfomo"):  # 3 rounds, 3 evaluations: each of two runs
        assert [n for m, n, size in served if m == method and size == 2] == ["train_together", "evaluate_together"] * 3


def test_stack_refuses_an_executor_it_would_replace(capsys):
    """#72 §4: --stack never replaces a chosen executor silently (each run's config.yaml would say sequential)."""
    assert main([*BASE, "--stack", "--set", "train.executor=sequential"]) == 2
    err = capsys.readouterr().err.strip()
    assert "train.executor = 'sequential'" in err and "'vectorised'" in err and len(err.splitlines()) == 1


def test_a_stacked_sweep_reports_its_rounds_and_no_eta_from_runs_that_finish_together(capsys, monkeypatch, tmp_path):
    """#72 §4: a stacked sweep was silent until its runs finished together, then printed an ETA made of runs done."""
    from hetfed.executors import stacked_runs
    from hetfed.runs import sweep

    seen: list[tuple[int, int]] = []
    ready: list[tuple[int, int]] = []  # a run ready for its rounds before the other (what it waits for is said)
    events: list[str] = []  # the lockstep's answers (by kind) and its rounds told, in order
    original, original_ready = sweep.SweepProgress.stacked_round, sweep.SweepProgress.stacked_ready
    answer = stacked_runs.Rendezvous._answer
    monkeypatch.setattr(stacked_runs.Rendezvous, "_answer", staticmethod(
        lambda asking, together, key_of: (events.append(together.__name__) if asking else None,
                                          answer(asking, together, key_of))[1]))
    monkeypatch.setattr(sweep.SweepProgress, "stacked_round",
                        lambda self, done, total: seen.append((done, total)) or events.append("round")
                        or original(self, done, total))
    monkeypatch.setattr(sweep.SweepProgress, "stacked_ready",
                        lambda self, n, members: ready.append((n, members)) or original_ready(self, n, members))
    _ran([*BASE[:-5], "--seeds", "2", "--stack", "--out", str(tmp_path / "s")])  # not into ./runs
    assert seen and seen[-1] == (4, 4) and [d for d, _ in seen[:4]] == [1, 2, 3, 4]
    assert ready and set(ready) == {(1, 2)}, ready  # each method's rounds: the first run to arrive waits for one
    # each round told as soon as its steps are trained, before the answers that may end a run (it was told after
    # them, and a run's thread could report it done first, with the ETA of a round it had trained)
    told = [i for i, event in enumerate(events) if event == "round"]
    assert told and all(events[i - 1] == "train_together" for i in told), events[:20]
    out = capsys.readouterr().out
    finished = [line for line in out.splitlines() if " done, " in line]
    # none from rounds it has trained: the last round is told before any run can end and say it is done
    assert finished and all("ETA" not in line for line in finished), finished
    # and it says what it starts before its runs prepare their clients (it was silent until ten seconds of rounds)
    begun = [line for line in out.splitlines() if "runs to train" in line]
    assert len(begun) == 1 and "[2 runs to train, stacked: " in begun[0], out
    # and that a run's five methods take turns, and how to stack methods side by side instead
    assert "each run's 5 methods one after another (--each-method stacks them side by side)" in begun[0], begun
    assert out.index(begun[0]) < out.index(finished[0])


def test_a_binary_task_stacked_gives_its_aucs_as_without_stack(tmp_path):
    """The servers' models scored in one forward keep each run's AUC on the global test set (a binary task, whose
    evaluations are summarised one run at a time)."""
    args = ["sweep", str(REPO / "configs" / "cgau_digits_binary.yaml"), "--set", "train.rounds=4", "--set",
            "train.eval_every=2", "--seeds", "2", "--quiet"]
    _ran([*args, "--out", str(tmp_path / "alone")])
    _ran([*args, "--stack", "--out", str(tmp_path / "stacked")])
    alone = _runs(tmp_path / "alone", ())
    assert any("global_auc" in k[-1] for k in alone)
    _equal(_runs(tmp_path / "stacked", ()), alone)


def _checked_pools(monkeypatch) -> list:
    """Every joined pool checked as it is handed out: each run's rows are the pool it asked for (its features and
    labels); the runs whose rows were not, listed."""
    joining, wrong = stacked_work._joint_pool, []

    def joint_pool(executors, cache, part=None):
        x, y, offsets = joining(executors, cache, part)
        for e, at in zip(executors, offsets, strict=True):
            own_x, own_y = (e.pool.x, e.pool.y) if part is None else part(e)
            wrong.extend([] if torch.equal(x[at:at + len(own_x)], own_x) and torch.equal(y[at:at + len(own_y)], own_y)
                         else [e])
        return x, y, offsets

    monkeypatch.setattr(stacked_work, "_joint_pool", joint_pool)
    return wrong


def test_a_run_that_starts_flipping_labels_later_trains_on_its_flipped_labels_in_a_stack(tmp_path, monkeypatch):
    """Label flipping keeps the pool's features and changes the labels: a joined pool kept under the features alone
    handed a run that starts flipping in round 3 its clean labels again (found, fixed: kept under both)."""
    wrong = _checked_pools(monkeypatch)
    assert main(["sweep", str(REPO / "configs" / "default.yaml"), *DEVICE, "--set", "train.rounds=4",
                 "--set", "partition.clients=6", "--set", "methods=[{name: fedavg, algorithm: fedavg}]",
                 "--grid", "attack={kind: label_flip, fraction: 0.34},"
                           "{kind: label_flip, fraction: 0.34, start_round: 3}",
                 "--seeds", "1", "--quiet", "--stack", "--out", str(tmp_path / "s")]) == 0
    assert not wrong


def test_a_stacked_sweep_under_attack_gives_the_runs_of_the_sweep_run_one_by_one(tmp_path, monkeypatch):
    """Each run's malicious clients train on its own poisoned pool and change their own uploads (a backdoor boosted
    from round 2 on, label flipping from round 1 and from round 3: the same features, other labels, from a round on),
    a colluding attack crafts from its own run's honest updates (ALIE), and the
    backdoor's success on the server's and the clients' own models (Ditto) is each run's — the numbers one by one."""
    served: list[int] = []
    original = stacked_runs.train_together
    monkeypatch.setattr(stacked_runs, "train_together", lambda group: served.append(len(group)) or original(group))
    wrong = _checked_pools(monkeypatch)
    args = ["sweep", str(REPO / "configs" / "default.yaml"), *DEVICE, "--set", "train.rounds=4",
            "--set", "partition.clients=6", "--set", "train.eval_every=2",
            "--set", "methods=[{name: fedavg, algorithm: fedavg}, {name: ditto, algorithm: ditto}]",
            "--grid", "attack={kind: backdoor, fraction: 0.34, boost: 2, start_round: 2},"
                      "{kind: alie, fraction: 0.34, z: 1.5},{kind: label_flip, fraction: 0.34},"
                      "{kind: label_flip, fraction: 0.34, start_round: 3}",
            "--seeds", "2", "--quiet"]
    _ran([*args, "--out", str(tmp_path / "one_by_one")])
    _ran([*args, "--out", str(tmp_path / "stacked"), "--stack"])
    alone, stacked = _runs(tmp_path / "one_by_one", ("attack",)), _runs(tmp_path / "stacked", ("attack",))
    assert {k[-1] for k in alone} >= {"final.backdoor_accuracy", "final.local_backdoor_accuracy_mean"}
    _equal(stacked, alone)
    assert max(served) == 8  # the four attacks' and two seeds' runs of a method in one stack
    assert not wrong


def test_a_stacked_sweep_under_fltrust_gives_the_runs_of_the_sweep_run_one_by_one(tmp_path):
    """FLTrust's server trains on its own root set in each run's server step: each run's numbers as alone, beside
    runs whose server holds no data (their federations without the holdout)."""
    args = ["sweep", str(REPO / "configs" / "default.yaml"), *DEVICE, "--set", "train.rounds=3",
            "--set", "partition.clients=6", "--set", "attack={kind: sign_flip, fraction: 0.34}",
            "--set", "server_data.max_samples=60", "--grid", "server.combine.rule=mean,fltrust",
            "--set", "methods=[{name: fedavg, algorithm: fedavg}]", "--seeds", "2", "--quiet"]
    _ran([*args, "--out", str(tmp_path / "one_by_one")])
    _ran([*args, "--out", str(tmp_path / "stacked"), "--stack"])
    grid = ("server.combine.rule",)
    alone, stacked = _runs(tmp_path / "one_by_one", grid), _runs(tmp_path / "stacked", grid)
    _equal(stacked, alone)
    finals = {k[0]: v for k, v in alone.items() if k[-1] == "final.global_accuracy"}
    assert finals and len(set(finals.values())) > 1  # the rules differ


def test_methods_whose_clients_score_the_model_sent_evaluate_in_one_stack_across_methods(tmp_path, monkeypatch):
    """#74 §1 (runs of different methods share a call where their steps match): a sweep over methods (a grid of
    them, each run one method) runs them side by side; FedAvg's, FedProx's and SCAFFOLD's clients score the model their
    server sends, the base way, so their runs' evaluations are one computation (SCAFFOLD's control variates, which its
    clients keep, are not read) and their servers' models one forward; Ditto's clients score models of their own and
    evaluate apart; the servers that are the server chain alone (FedAvg's, FedProx's, Ditto's) aggregate in one call.
    runs.csv is the one-by-one sweep's, and every value of metrics.csv to float32's tolerance."""
    scored: list[tuple[str, ...]] = []
    aggregated: list[tuple[str, ...]] = []
    servers: list[int] = []
    evaluate, forward = stacked_runs.evaluate_together, stacked_runs.evaluate_servers
    monkeypatch.setattr(stacked_runs, "evaluate_together", lambda group: scored.append(
        tuple(sorted(r.executor.algo.spec.name for r in group))) or evaluate(group))
    aggregate = stacked_runs._aggregate_together
    monkeypatch.setattr(stacked_runs, "_aggregate_together", lambda group: aggregated.append(
        tuple(sorted(r.executor.algo.spec.name for r in group))) or aggregate(group))
    monkeypatch.setattr(stacked_runs, "evaluate_servers",
                        lambda algos, *a: servers.append(len(algos)) or forward(algos, *a))
    methods = "methods=" + ",".join(f"[{{algorithm: {m}}}]" for m in ("fedavg", "fedprox", "scaffold", "ditto"))
    args = ["sweep", str(REPO / "configs" / "default.yaml"), *DEVICE, "--set", "train.rounds=3", "--set",
            "partition.clients=4", "--set", "train.local_steps=2", "--set", "heterogeneity.iid_draws=0", "--set",
            "train.eval_every=1", "--grid", methods, "--seeds", "2", "--quiet"]
    _ran([*args, "--out", str(tmp_path / "one_by_one")])
    _ran([*args, "--stack", "--out", str(tmp_path / "stacked")])
    _equal(_runs(tmp_path / "stacked", ("methods",)), _runs(tmp_path / "one_by_one", ("methods",)))
    # each round's losses to float32's tolerance: the joined evaluation computes its logits in blocks of other shapes
    alone, joined = _metrics(tmp_path / "one_by_one"), _metrics(tmp_path / "stacked")
    assert alone.keys() == joined.keys() and len(alone) > 500
    for key, value in alone.items():
        assert joined[key] == pytest.approx(value, rel=1e-6 if ON_CPU else 1e-5, abs=1e-8), key
    together = ("fedavg", "fedavg", "fedprox", "fedprox", "scaffold", "scaffold")
    assert scored.count(together) == 3 and scored.count(("ditto", "ditto")) == 3  # 3 evaluations each
    assert servers.count(8) == 3  # every run's server model (Ditto's too: its server's is the global model)
    # servers that are the server chain alone (FedAvg's, FedProx's, Ditto's) step their chains in one call;
    # SCAFFOLD's aggregates its own way, alone
    assert aggregated == [("ditto", "ditto", "fedavg", "fedavg", "fedprox", "fedprox")] * 3


def test_methods_that_train_with_fedavgs_step_share_a_stack_across_methods(tmp_path, monkeypatch):
    """#74 §1: kNN-Per's, FedMoE's and FedDF's clients train with FedAvg's step unchanged (its local update, no term
    of their own, none of their parameters read), so a sweep over methods trains their runs' clients in one stack with
    FedAvg's; FedProx's step has its proximal term and trains apart. runs.csv is the one-by-one sweep's."""
    trained: list[tuple[str, ...]] = []
    original = stacked_runs.train_together
    monkeypatch.setattr(stacked_runs, "train_together", lambda group: trained.append(
        tuple(sorted(r.executor.algo.spec.name for r in group))) or original(group))
    from hetfed.algorithms import registry

    methods = "methods=" + ",".join(json.dumps([{"algorithm": m, "params": dict(registry.get(m).quick)}])
                                    for m in ("fedavg", "knnper", "fedmoe", "feddf", "fedprox"))
    args = ["sweep", str(REPO / "configs" / "default.yaml"), *DEVICE, "--set", "train.rounds=3", "--set",
            "partition.clients=4", "--set", "train.local_steps=2", "--set", "heterogeneity.iid_draws=0", "--set",
            "train.eval_every=1", "--set", "server_data.max_samples=60", "--grid", methods, "--seeds", "2", "--quiet"]
    _ran([*args, "--out", str(tmp_path / "one_by_one")])
    _ran([*args, "--stack", "--out", str(tmp_path / "stacked")])
    _equal(_runs(tmp_path / "stacked", ("methods",)), _runs(tmp_path / "one_by_one", ("methods",)))
    together = tuple(sorted(2 * ("fedavg", "knnper", "fedmoe", "feddf")))
    assert trained.count(together) == 3 and trained.count(("fedprox", "fedprox")) == 3, trained
