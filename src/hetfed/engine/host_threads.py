"""How many threads a worker process computes with: torch's pool and every BLAS and OpenMP pool loaded in it.

Why all of them: a sweep's ``--jobs N`` workers each get ``cores // N`` threads, and setting torch's pool (and the
``*_NUM_THREADS`` variables) was not enough. A worker is a spawned process that imports the sweep's module to unpickle
its task, and with it numpy, whose OpenBLAS reads its variable once, when loaded: it kept one thread per core. Two
workers measuring Γ (BLAS-heavy) then ran four threads on two cores, and OpenBLAS's idle threads spin: the same sweep
(PFLlib's Fashion-MNIST split, 3 methods × 3 seeds, ``--jobs 2``) took 52 s once and 369 s (723 CPU-seconds) the
next (``results/benchmarks_cpu_2026-11-29i``). threadpoolctl sets the pools already loaded; the variables reach those
loaded later.

And how many the ``hetfed`` command computes with when other processes keep cores busy (:func:`fit_to_idle_cores`):
torch's OpenMP threads spin while they wait for each other, so a pool of one thread per core beside a busy core
waits on the thread the busy core holds up. Measured on this project's 2-core CPU (2026-12-07, ``hetfed run``, the
default experiment): 13.4 s quiet on 2 threads, 14.4–15.5 s on one; beside a Python loop holding one core, 36.4 s
on 2 threads and 15.3 s with OpenMP's threads sleeping instead of spinning (``OMP_WAIT_POLICY=PASSIVE``, which costs
25–40 % quiet: 16.6–18.6 s) — one thread fewer per busy core keeps the quiet speed.
"""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import dataclass

from hetfed.errors import HetfedNote

#: the variables the BLAS and OpenMP libraries read when they are loaded
VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def limit_threads(n: int) -> None:
    """From now on this process computes with ``n`` threads: torch's, numpy's and scipy's BLAS, OpenMP's."""
    for var in VARIABLES:
        os.environ[var] = str(n)
    import numpy  # noqa: F401  # loaded now, so that threadpoolctl limits their pools below
    import scipy.linalg  # noqa: F401  # scipy's wheels bring an OpenBLAS of their own
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(n)
    threadpool_limits(limits=n)


@dataclass(frozen=True)
class CpuReading:
    """The cores this process may run on, at one moment: ``busy`` CPU-seconds they have spent on any process since
    boot, ``own`` this process's CPU-seconds (all its threads), ``wall`` a monotonic clock's seconds."""

    wall: float
    busy: float
    own: float
    cores: int


#: the ``hetfed`` command's start (:func:`hetfed.cli.entry`); None in a library call or a test's process, whose
#: threads are the caller's to choose
STARTED: CpuReading | None = None
#: the cores other processes left idle, as :func:`fit_to_idle_cores` judged them (None: not judged)
IDLE: int | None = None
#: the shortest reading :func:`fit_to_idle_cores` judges the other processes by (a process's time moves in ticks of
#: 10 ms: a shorter one could not tell one busy core from none)
MIN_WINDOW_S = 0.3


def cpu_reading() -> CpuReading | None:
    """The cores' and this process's CPU time now, from ``/proc/stat`` (None where there is none: not Linux).
    Busy: user, nice, system, irq and softirq — not idle, I/O wait or the time a hypervisor stole."""
    try:
        cores = os.sched_getaffinity(0)
        with open("/proc/stat") as fh:
            lines = [line.split() for line in fh if line.startswith("cpu") and line[3:4].isdigit()]
    except (OSError, AttributeError):
        return None
    ticks = sum(sum(int(v) for i, v in enumerate(fields[1:8]) if i not in (3, 4))
                for fields in lines if int(fields[0][3:]) in cores)
    times = os.times()
    return CpuReading(time.monotonic(), ticks / os.sysconf("SC_CLK_TCK"), times.user + times.system, len(cores))


def busy_elsewhere(before: CpuReading, after: CpuReading) -> float:
    """How many cores other processes kept busy between two readings, on average."""
    wall = after.wall - before.wall
    if wall <= 0:
        return 0.0
    return max(0.0, ((after.busy - before.busy) - (after.own - before.own)) / wall)


def idle_cores(cores: int, elsewhere: float) -> int:
    """The cores of ``cores`` left to compute on when ``elsewhere`` are busy with other processes: one fewer per busy
    core (to the nearest), never fewer than one."""
    return max(1, cores - round(elsewhere))


def allowed_cores() -> int:
    """The cores this process may use: those of its affinity, at most its container's CPU quota (cgroup v1's or v2's
    ``cpu.max``, rounded up) — joblib's count (``LOKY_MAX_CPU_COUNT`` lowers it too). Why not ``os.cpu_count()``: a
    container limited by quota sees every core of its host, and a pool of one thread per host core on a quota of a
    few is throttled. A ``LOKY_MAX_CPU_COUNT`` joblib could not read is refused in hetfed's words (joblib raises a
    bare ``ValueError``)."""
    import joblib

    from hetfed.environment import positive

    positive("LOKY_MAX_CPU_COUNT", 1, integer=True)
    return max(1, int(joblib.cpu_count()))


def usable_cores() -> int:
    """The cores a sweep shares among its processes: those other processes left idle where the ``hetfed`` command
    judged them (:func:`fit_to_idle_cores`), else those this process may use (:func:`allowed_cores`)."""
    return IDLE if IDLE is not None else allowed_cores()


def fit_to_idle_cores(others: bool = True) -> int | None:
    """The ``hetfed`` command's threads fitted to the cores other processes leave idle, judged from its start
    (:data:`STARTED`) to now (at least :data:`MIN_WINDOW_S`); a ``note:`` says so when they are fewer than torch's
    default. The idle cores are at most those the process may use (:func:`allowed_cores`: a container's CPU quota);
    ``others`` False: only those (a command whose work gains from every core even beside busy ones).
    Returns the threads chosen, or None when nothing is judged: not started as the command, not Linux, or a
    thread count chosen in the environment (``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``)."""
    if STARTED is None or any(os.environ.get(var) for var in VARIABLES):
        return None
    now = cpu_reading()
    if now is None:
        return None
    if others and now.wall - STARTED.wall < MIN_WINDOW_S:
        time.sleep(MIN_WINDOW_S - (now.wall - STARTED.wall))
        now = cpu_reading() or now
    import torch

    global IDLE
    current, allowed = torch.get_num_threads(), allowed_cores()
    elsewhere = busy_elsewhere(STARTED, now) if others else 0.0
    left = idle_cores(now.cores, elsewhere)
    IDLE = min(left, allowed)
    chosen = min(current, IDLE)
    if chosen < current:
        limit_threads(chosen)
        why = (f"other processes kept {elsewhere:.1f} of this machine's {now.cores} cores busy" if left < allowed
               else f"this process may use {allowed} of this machine's {now.cores} cores (its cgroup's CPU quota or "
               "LOKY_MAX_CPU_COUNT)")
        warnings.warn(f"{why}: computing on {chosen} thread{'s' if chosen > 1 else ''} instead of {current} "
                      "(OMP_NUM_THREADS=N chooses)", HetfedNote, stacklevel=2)
    return chosen
