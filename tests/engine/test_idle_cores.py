"""The ``hetfed`` command computes on the cores other processes leave idle (``hetfed.engine.host_threads``): one
thread fewer per core another process keeps busy, said in a ``note:`` line, and never where the environment chose."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hetfed.engine import host_threads
from hetfed.engine.host_threads import CpuReading, busy_elsewhere, idle_cores
from hetfed.errors import HetfedNote

LINUX = sys.platform.startswith("linux")


def test_busy_elsewhere_is_the_cores_busy_less_this_process_over_the_wall_time():
    before = CpuReading(wall=10.0, busy=100.0, own=3.0, cores=4)
    after = CpuReading(wall=12.0, busy=105.0, own=4.0, cores=4)  # 5 CPU-s busy in 2 s, 1 of them this process's
    assert busy_elsewhere(before, after) == pytest.approx(2.0)
    assert busy_elsewhere(before, CpuReading(12.0, 100.5, 4.0, 4)) == 0.0  # ticks counted apart never go negative
    assert busy_elsewhere(before, before) == 0.0


@given(st.integers(1, 256), st.floats(0, 512, allow_nan=False))
def test_idle_cores_leave_at_least_one_and_never_more_than_the_machine(cores, elsewhere):
    idle = idle_cores(cores, elsewhere)
    assert 1 <= idle <= cores
    assert idle == max(1, cores - round(elsewhere))


def test_a_quiet_machine_leaves_every_core():
    assert idle_cores(2, 0.3) == 2 and idle_cores(16, 0.0) == 16


@pytest.mark.skipif(not LINUX, reason="/proc/stat is Linux's")
def test_a_reading_counts_the_cores_this_process_may_use_and_its_own_time():
    before = host_threads.cpu_reading()
    end = time.process_time() + 0.2
    while time.process_time() < end:  # 0.2 CPU-seconds of this process's own
        pass
    after = host_threads.cpu_reading()
    assert before is not None and after is not None
    assert after.cores == len(os.sched_getaffinity(0))
    # os.times counts in 10 ms ticks: each reading may fall up to a tick short (CI76 read 14.51 − 14.32 = 0.18999…)
    assert after.own - before.own >= 0.2 - 0.02
    assert after.busy - before.busy >= 0.15  # the cores' count saw it too (in 10 ms ticks)


def _judged(monkeypatch, elsewhere: float, cores: int = 2, threads: int = 2, allowed: int | None = None
            ) -> tuple[int | None, list[int]]:
    """:func:`fit_to_idle_cores` with readings that put ``elsewhere`` cores' work of other processes over 1 s, the
    process allowed ``allowed`` cores (None: all ``cores``)."""
    import torch

    limited: list[int] = []
    monkeypatch.setattr(host_threads, "STARTED", CpuReading(0.0, 0.0, 0.0, cores))
    monkeypatch.setattr(host_threads, "cpu_reading", lambda: CpuReading(1.0, elsewhere + 0.5, 0.5, cores))
    monkeypatch.setattr(host_threads, "limit_threads", limited.append)
    monkeypatch.setattr(host_threads, "IDLE", None)
    monkeypatch.setattr(host_threads, "allowed_cores", lambda: cores if allowed is None else allowed)
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)
    for var in host_threads.VARIABLES:
        monkeypatch.delenv(var, raising=False)
    return host_threads.fit_to_idle_cores(), limited


def test_a_busy_core_takes_one_thread_and_says_so(monkeypatch):
    with pytest.warns(HetfedNote, match=r"other processes kept 1\.0 of this machine's 2 cores busy: computing on 1 "
                                        r"thread instead of 2 \(OMP_NUM_THREADS=N chooses\)"):
        chosen, limited = _judged(monkeypatch, elsewhere=1.0)
    assert chosen == 1 and limited == [1]
    from hetfed.runs.sweep import worker_threads

    assert worker_threads(1) == 1  # a sweep's workers share the idle core


def test_idle_cores_keep_the_threads_and_say_nothing(monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _judged(monkeypatch, elsewhere=0.2) == (2, [])
        assert _judged(monkeypatch, elsewhere=1.0, cores=16, threads=8) == (8, [])  # torch's 8 of 15 idle cores


def test_a_cpu_quota_below_the_threads_takes_them_down_and_says_why(monkeypatch):
    """A container limited by quota sees its host's cores: torch's pool of one thread per core is cut to the quota,
    with the quota, not other processes, named as the reason; a sweep's workers share the quota's cores."""
    with pytest.warns(HetfedNote, match=r"this process may use 2 of this machine's 16 cores \(its cgroup's CPU "
                                        r"quota or LOKY_MAX_CPU_COUNT\): computing on 2 threads instead of 16"):
        chosen, limited = _judged(monkeypatch, elsewhere=0.0, cores=16, threads=16, allowed=2)
    assert chosen == 2 and limited == [2]
    from hetfed.runs.sweep import worker_threads

    assert worker_threads(2) == 1
    with pytest.warns(HetfedNote, match="other processes kept 15.0"):  # busier than the quota: the load says why
        assert _judged(monkeypatch, elsewhere=15.0, cores=16, threads=16, allowed=2)[0] == 1


def test_allowed_cores_are_joblibs_count_with_its_limits(monkeypatch):
    """What a process may use is joblib's count: affinity, cgroup quota and ``LOKY_MAX_CPU_COUNT`` (checked here, the
    one a test can set), never more than the cores of this process's affinity."""
    monkeypatch.delenv("LOKY_MAX_CPU_COUNT", raising=False)
    assert 1 <= host_threads.allowed_cores() <= len(os.sched_getaffinity(0)) if LINUX else True
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", "1")
    assert host_threads.allowed_cores() == 1
    monkeypatch.setattr(host_threads, "IDLE", None)
    assert host_threads.usable_cores() == 1  # a sweep's workers share what the process may use, not os.cpu_count()


@pytest.mark.parametrize("value", ["abc", "0", "-2", "1.5"])
def test_a_cpu_limit_joblib_cannot_read_is_refused_in_one_line(monkeypatch, tmp_path: Path, value: str):
    """``LOKY_MAX_CPU_COUNT`` is joblib's, but the command reads it through joblib: a value joblib would crash on (or
    take as no core) ends the command with exit status 2 and a line naming it, before any run directory."""
    from hetfed.errors import ConfigError

    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", value)
    with pytest.raises(ConfigError, match=rf"LOKY_MAX_CPU_COUNT = '{value}' is not allowed: expected a whole number "
                                          "above 0"):
        host_threads.allowed_cores()
    env = {k: v for k, v in os.environ.items() if k not in host_threads.VARIABLES}
    proc = subprocess.run([sys.executable, "-m", "hetfed", "run", "--out", str(tmp_path / "run")], capture_output=True,
                          text=True, env=env, timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "LOKY_MAX_CPU_COUNT" in proc.stderr, proc.stderr
    assert not (tmp_path / "run").exists()


def test_threads_chosen_in_the_environment_or_a_call_in_process_are_left_alone(monkeypatch):
    with pytest.warns(HetfedNote):
        _judged(monkeypatch, elsewhere=1.0)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert host_threads.fit_to_idle_cores() is None
    monkeypatch.delenv("OMP_NUM_THREADS")
    monkeypatch.setattr(host_threads, "STARTED", None)  # not started as the hetfed command (a library call)
    assert host_threads.fit_to_idle_cores() is None


@pytest.mark.slow
@pytest.mark.skipif(not LINUX or (os.cpu_count() or 1) < 2, reason="needs /proc/stat and two cores")
def test_hetfed_run_beside_busy_cores_computes_on_the_idle_one(tmp_path: Path):
    """The command itself: with every core but one held by other processes, ``hetfed run`` notes it, computes on one
    thread and records that in its summary."""
    env = {k: v for k, v in os.environ.items() if k not in host_threads.VARIABLES}
    spinning = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(len(os.sched_getaffinity(0)) - 1)]
    try:
        time.sleep(0.5)
        proc = subprocess.run([sys.executable, "-m", "hetfed", "run", "--set", "train.rounds=1", "--no-report",
                               "--quiet", "--out", str(tmp_path / "run")], capture_output=True, text=True, env=env,
                              timeout=600)
    finally:
        for p in spinning:
            p.kill()
            p.wait()
    assert proc.returncode == 0, proc.stderr
    assert "note: other processes kept" in proc.stderr and "computing on 1 thread instead of" in proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["environment"]["torch_threads"] == 1


@pytest.mark.slow
@pytest.mark.skipif(not LINUX or len(os.sched_getaffinity(0)) < 2, reason="needs two cores")
def test_hetfed_run_under_a_cpu_limit_computes_on_the_cores_it_may_use(tmp_path: Path):
    """The command itself, limited to one core as joblib reads a limit (``LOKY_MAX_CPU_COUNT``, as a container's
    quota would): it notes it, computes on one thread and records that in its summary."""
    env = {k: v for k, v in os.environ.items() if k not in host_threads.VARIABLES} | {"LOKY_MAX_CPU_COUNT": "1"}
    proc = subprocess.run([sys.executable, "-m", "hetfed", "run", "--set", "train.rounds=1", "--no-report", "--quiet",
                           "--out", str(tmp_path / "run")], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "note: this process may use 1 of this machine's" in proc.stderr, proc.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["environment"]["torch_threads"] == 1
    assert summary["environment"]["cores_allowed"] == 1 and summary["environment"]["cores_idle_at_start"] == 1


def test_a_command_that_keeps_every_idle_core_still_keeps_to_its_quota(monkeypatch):
    """``others=False`` (``hetfed partition``: Γ gains from every core even beside busy ones) leaves the load of other
    processes alone but not the quota."""
    with pytest.warns(HetfedNote, match="other processes kept 1.0"):
        _judged(monkeypatch, elsewhere=1.0)  # a busy core in the readings: judged again below without the load
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert host_threads.fit_to_idle_cores(others=False) == 2
    monkeypatch.setattr(host_threads, "allowed_cores", lambda: 1)
    with pytest.warns(HetfedNote, match="this process may use 1 of this machine's 2 cores"):
        assert host_threads.fit_to_idle_cores(others=False) == 1


def test_a_runs_environment_says_its_cpu_and_the_cores_it_could_use(monkeypatch):
    """summary.json's environment: the CPU's model and vector width (numbers round by it), the cores the process
    could use, and the idle ones where the command judged them — what makes two runs' timings comparable or not."""
    import torch

    from hetfed.runs.rundir import environment

    monkeypatch.setattr(host_threads, "IDLE", None)
    env = environment()
    assert env["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert env["cores_allowed"] == host_threads.allowed_cores() and "cores_idle_at_start" not in env
    if LINUX:
        assert env["cpu"]
    monkeypatch.setattr(host_threads, "IDLE", 1)
    assert environment()["cores_idle_at_start"] == 1
