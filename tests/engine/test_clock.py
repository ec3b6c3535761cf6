"""The simulated clock (#49): a synchronous round lasts as long as its slowest reporting client (hand-computed from
a speeds file), a deadline drops the late ones, slow clients can hold different classes, and every run records
``sim_time`` and the bytes that travelled."""

from __future__ import annotations

import csv
import math

import numpy as np
import pytest

from hetfed.algorithms import build_algorithm
from hetfed.cli import main
from hetfed.config import ClockConfig, ModelConfig, PartitionConfig, TrainConfig
from hetfed.engine.clock import Clock
from hetfed.engine.local import LocalSchedule
from hetfed.errors import ConfigError
from hetfed.executors.simulate import simulate
from hetfed.models import build_model
from hetfed.partition import make_federation
from tests.synthetic import ShiftedGaussians

SECONDS = [0.010, 0.002, 0.030, 0.001, 0.004, 0.020]  # each client's seconds per sample
UP = [1.0, 0.01, 5.0, 2.0, 0.5, 1.0]  # Mbit/s
DOWN = [10.0, 1.0, 10.0, 10.0, 2.0, 10.0]


def _fed(clients: int = 6):
    data = ShiftedGaussians(n=240, d=5, classes=3)
    return make_federation(data, PartitionConfig(kind="dirichlet", clients=clients, alpha=1.0, min_size=8), 0)


def _speeds_file(tmp_path) -> str:
    path = tmp_path / "speeds.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["client", "sample_seconds", "uplink_mbps", "downlink_mbps"])
        for k in reversed(range(6)):  # any row order
            w.writerow([k, SECONDS[k], UP[k], DOWN[k]])
    return str(path)


def _run(tmp_path, rounds=2, **clock):
    fed = _fed()
    train = TrainConfig(rounds=rounds, local_steps=2, batch_size=8, eval_every=1,
                        optimizer={"kind": "sgd", "lr": 0.05, "momentum": 0.0},
                        clock={"latency": "file", "file": _speeds_file(tmp_path), **clock})
    model = build_model(ModelConfig(kind="mlp", hidden=[4]), fed.input_shape, fed.n_classes)
    algo = build_algorithm("fedavg", model, train)
    return simulate(algo, fed, train, seed=0), model


def _by_hand(model) -> list[float]:
    """Each client's round, written out: 2 steps × 8 samples × its seconds per sample, the model down (float32) and
    the model, its sample count and its loss up, at its bandwidths."""
    params = model.n_params()
    down, up = 4 * params, 4 * params + 8
    return [16 * SECONDS[k] + down * 8 / (DOWN[k] * 1e6) + up * 8 / (UP[k] * 1e6) for k in range(6)]


def test_a_round_lasts_as_long_as_its_slowest_client(tmp_path):
    result, model = _run(tmp_path)
    times = _by_hand(model)
    assert math.isclose(result.round_time, max(times), rel_tol=1e-12)
    assert math.isclose(result.sim_time, 2 * max(times), rel_tol=1e-12)  # two rounds, everyone each time
    assert result.faults["clients_late"] == 0


def test_a_deadline_drops_the_late_clients_and_the_round_lasts_the_deadline(tmp_path):
    _, model = _run(tmp_path, rounds=1)
    times = _by_hand(model)
    deadline = sorted(times)[3] + 1e-9  # four make it, two do not
    result, _ = _run(tmp_path, rounds=1, deadline=deadline)
    assert result.faults["clients_late"] == 2 and result.faults["clients_aggregated"] == 4
    assert math.isclose(result.sim_time, deadline)
    assert result.uplink_bytes == 4 * (4 * model.n_params() + 8)  # the late ones sent nothing
    assert result.downlink_bytes == 6 * 4 * model.n_params()  # everyone sampled received the model


def test_speeds_drawn_from_the_seed_have_the_configured_median_and_repeat():
    fed = _fed(clients=6)
    sched = LocalSchedule(steps=1, batch_size=8)
    big = make_federation(ShiftedGaussians(n=4000, d=2, classes=4), PartitionConfig(kind="iid", clients=2000), 0)
    train = TrainConfig(local_steps=1, batch_size=8, clock={"latency": "lognormal", "spread": 1.0,
                                                              "sample_seconds": 0.01})
    clock = Clock.of(train, big, 7, sched)
    assert abs(np.median(clock.compute) / (2 * 0.01) - 1) < 0.1  # 1 step of min(B, n_k) = 2 samples each
    assert np.array_equal(clock.compute, Clock.of(train, big, 7, sched).compute)
    assert not np.array_equal(clock.compute, Clock.of(train, big, 8, sched).compute)
    constant = Clock.of(TrainConfig(local_steps=1, batch_size=8), fed, 0, sched)
    assert np.allclose(constant.compute, 8 * 1e-3) and np.isinf(constant.uplink).all()


def test_by_label_gives_the_slowest_speeds_to_the_highest_classes():
    data = ShiftedGaussians(n=900, d=2, classes=3)
    fed = make_federation(data, PartitionConfig(kind="shards", clients=9, shards_per_client=1), 0)
    train = TrainConfig(local_steps=1, batch_size=8, clock={"latency": "lognormal", "slow": "by_label"})
    clock = Clock.of(train, fed, 0, LocalSchedule(steps=1, batch_size=8))
    majority = np.array([np.bincount(np.asarray(fed.y)[i], minlength=3).argmax() for i in fed.train])
    slow_first = np.argsort(-clock.compute, kind="stable")
    assert list(majority[slow_first][:3]) == [2, 2, 2] and list(majority[slow_first][-3:]) == [0, 0, 0]


def test_stragglers_are_the_clock_in_median_steps():
    fed = _fed()
    train = TrainConfig(local_steps=3, batch_size=8, stragglers={"distribution": "lognormal", "deadline": 4.0})
    clock = Clock.of(train, fed, 0, LocalSchedule(steps=3, batch_size=8))
    from hetfed.engine.clock import step_times

    assert clock.unit == "steps" and np.allclose(clock.compute, 3 * step_times(train.stragglers, 6, 0))


@pytest.mark.parametrize("train,says", [
    ({"stragglers": {"distribution": "lognormal"}, "clock": {"deadline": 2.0}}, "train.stragglers.distribution"),
    ({"clock": {"latency": "file"}}, "train.clock.file is required"),
    ({"clock": {"file": "x.csv"}}, "unknown key 'train.clock.file' = 'x.csv': did you mean 'file' of latency model"),
    ({"clock": {"sample_seconds": 0}}, "sample_seconds"),
    ({"stragglers": {"deadline": 3.0}}, "nobody would be late"),
])
def test_clock_settings_that_cannot_both_hold_are_refused(train, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        TrainConfig(**train)


def test_a_speeds_file_that_does_not_cover_the_clients_is_refused(tmp_path):
    path = tmp_path / "s.csv"
    path.write_text("client,sample_seconds\n0,0.1\n1,0.2\n")
    train = TrainConfig(local_steps=1, clock={"latency": "file", "file": str(path)})
    with pytest.raises(ConfigError, match="one row for each client 0 … 5"):
        Clock.of(train, _fed(), 0, LocalSchedule(steps=1, batch_size=8))


def test_every_run_records_sim_time_beside_rounds(tmp_path):
    out = tmp_path / "run"
    assert main(["run", "--out", str(out), "--quiet", "--set", "train.rounds=3",
                 "--set", "train.clock.latency=exponential"]) == 0
    rows = list(csv.DictReader((out / "metrics.csv").read_text().splitlines()))

    def series(split, metric):
        return [float(r["value"]) for r in rows if r["method"] == "relu" and r["split"] == split
                and r["metric"] == metric]

    rounds = series("train", "round_time")
    assert len(rounds) == 3 and min(rounds) > 0
    assert series("train", "sim_time") == pytest.approx(list(np.cumsum(rounds)))
    assert series("summary", "sim_time") == pytest.approx(list(np.cumsum(rounds)))


def test_clock_defaults_validate():
    assert ClockConfig().latency == "constant"


def test_uplink_bytes_count_what_an_upload_carries_besides_its_parameters(tmp_path):
    """FedProto sends no parameters but its prototypes and class counts: each client's uplink is its sample count
    and training loss (8 bytes) plus 10 classes × 64 features and 10 counts, float32."""
    import csv

    from hetfed.cli import main

    out = tmp_path / "r"
    assert main(["run", "--quiet", "--out", str(out), "--set", "train.rounds=2", "--set",
                 "methods=[{name: fedproto, algorithm: fedproto}]"]) == 0
    rows = list(csv.DictReader((out / "metrics.csv").read_text().splitlines()))
    up = [float(r["value"]) for r in rows if r["split"] == "train" and r["metric"] == "uplink_bytes"]
    assert up == [10 * (8 + 4 * 10 * 64 + 4 * 10)] * 2


def test_a_wall_clock_reads_no_modelled_speed_and_says_so():
    """``latency: wall`` times real exchanges: the modelled speeds typed beside it are named as unread (a note), not
    silently ignored."""
    unread = ClockConfig(latency="wall", sample_seconds=0.01, uplink_mbps=5.0).unread()
    assert set(unread) == {"sample_seconds", "uplink_mbps"}
    assert all("times the clients' real exchanges" in why for _, why in unread.values())
    assert not ClockConfig(sample_seconds=0.01).unread()
