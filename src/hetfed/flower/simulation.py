"""``train.executor: flower`` — a hetfed run on Flower's Simulation Engine.

The server's round loop (:func:`hetfed.executors.simulate.simulate`) runs inside a
Flower ``ServerApp`` whose executor is a :class:`~hetfed.flower.executor.FlowerExecutor`;
the clients are hetfed's ``ClientApp`` on one virtual SuperNode per client
(``partition-id`` = client id). Nothing here is a second implementation of a
method: the ServerApp and the ClientApp run the same algorithm object.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from hetfed.errors import HetfedError, RunError, Terminated, interruption_reason
from hetfed.flower import require_flwr
from hetfed.processes import descendants, exit_now, signal_all

T = TypeVar("T")


def simulation_nodes(config, n_clients: int) -> int:
    """How many SuperNodes a simulation of ``n_clients`` starts: ``flower.clients_per_node`` clients each (node P
    holds the P-th contiguous block, :func:`hetfed.flower.node.node_clients`)."""
    return -(-n_clients // config.flower.clients_per_node)


def run_with_simulation_grid(config, n_clients: int, body: Callable[[object], T], log_file: Path | None = None,
                             status=None) -> T:
    """Start Flower's Simulation Engine with :func:`simulation_nodes` SuperNodes for a federation of
    ``n_clients``; ``body(grid)`` runs in the ServerApp.

    One start serves every method of a run (``hetfed run`` trains them all inside one ServerApp, as on a
    deployment): Ray's start and stop cost several seconds each. Flower's own log lines go to ``log_file``
    (the run directory's ``flower.log``), not the console. An exception in the ServerApp — the server's
    step, a record that cannot travel, every ClientApp failing — ends the simulation and comes back as one
    line naming what failed and the log file. ``status`` (a console) is told when the start begins and ends:
    Ray's start takes ~30 s on 2 cores, with nothing else to show.
    """
    require_flwr()
    from flwr.simulation import run_simulation

    from hetfed.flower.client_app import app as client_app

    restore = _log_to_file(log_file)
    handlers = _prepare_ray()
    holder: dict[str, T] = {}
    t0 = time.perf_counter()

    def started() -> None:
        if status is not None:
            status.print(f"Flower's ServerApp runs ({time.perf_counter() - t0:.0f} s); the SuperNodes' ClientApps "
                         "start "
                         "with the first round's messages, so the first method's first round includes Ray's start",
                         soft_wrap=True)

    server_app = _server_app(body, holder, log_file, started)
    backend = ray_backend(config)
    where = f" (Flower's log: {log_file})" if log_file else ""
    _say_starting(status, config, n_clients)

    def start() -> None:
        _start_ray(backend)
        if handlers:  # after ray.init, which put its own SIGTERM handler in: a signal now stops the ServerApp
            _stop_on_signals(holder)
        run_simulation(server_app, client_app, num_supernodes=simulation_nodes(config, n_clients),
                       backend_config=backend)

    try:
        start_with_retries(start, lambda: _began(holder), log_file, reset=lambda: _abandon(holder))
    except SystemExit as err:  # Ray's SIGTERM handler, during ray.init: stop like hetfed does (exit 143, run failed)
        if err.code == signal.SIGTERM:
            raise Terminated(signal.SIGTERM) from None
        raise
    except Exception as err:
        if "error" not in holder and "stop" not in holder:
            raise RunError(f"Flower's Simulation Engine failed: {type(err).__name__}: {err}{where}") from err
    finally:
        outcome = dict(holder)
        _abandon(holder)  # a ServerApp still waiting for replies that will never come (the engine failed) ends now
        restore()
        for signum, handler in handlers.items():  # hetfed's own, which ray.init and the run replaced
            signal.signal(signum, handler)
        _stop_ray()
    return _outcome(outcome, where)


def _say_starting(status, config, n_clients: int) -> None:
    """The console told that the engine starts, on what: Ray's start has nothing else to show for ~30 s."""
    if status is not None:
        on = f"the Ray cluster at {config.flower.ray_address}" if config.flower.ray_address else "Ray; ~30 s on 2 cores"
        status.print(f"starting Flower's Simulation Engine ({simulation_nodes(config, n_clients)} SuperNodes on {on}) "
                     "…", soft_wrap=True)


def _began(holder: dict) -> bool:
    """Whether the run has begun, so that starting the engine again would repeat it or fail as it did: a node has
    answered the ServerApp, or the ServerApp failed on its own (not for want of replies) — or a signal asked the
    run to stop, which a new start would not undo."""
    from hetfed.flower.exchange import Abandoned, answered

    failed = "error" in holder and not isinstance(holder["error"], Abandoned)
    return "stop" in holder or failed or ("grid" in holder and answered(holder["grid"]))


def _abandon(holder: dict, timeout: float = 10.0) -> None:
    """The ServerApp told that no reply will come (:func:`~hetfed.flower.exchange.abandon`) and waited for (at most
    ``timeout``), then forgotten: after the Simulation Engine failed, its thread would otherwise wait out
    ``flower.connect_timeout`` — minutes in which the failed run's process could not exit."""
    from hetfed.flower.exchange import abandon

    if "grid" in holder:
        abandon(holder["grid"])
    thread = holder.get("thread")
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout)
    holder.clear()


def ray_backend(config) -> dict:
    """Flower's backend config: each ClientApp's CPUs, and a Ray of the run's own started here — or, with
    ``flower.ray_address``, the running cluster at that address joined (its nodes host the ClientApps; hetfed and
    the data must be installed on each: ``docs/flower.md``)."""
    init_args: dict = {"logging_level": "ERROR", "log_to_driver": False, "include_dashboard": False,
                       # "local": a Ray of this run's own, even where `ray start` or RAY_ADDRESS left a cluster that
                       # a plain ray.init() would join unasked
                       "address": config.flower.ray_address or "local"}
    return {"client_resources": {"num_cpus": config.flower.client_cpus, "num_gpus": 0.0}, "init_args": init_args}


def _prepare_ray() -> dict[int, Any]:
    """Ray's settings for a run inside hetfed; the SIGTERM and SIGINT handlers to put back after (none off the main
    thread, where a handler cannot be set)."""
    # Ray's C++ failure handler turns SIGTERM into an abort (exit 134); its Python handler raises SystemExit(15)
    os.environ.setdefault("RAY_DISABLE_FAILURE_SIGNAL_HANDLER", "1")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    # Ray starts a worker per CPU for tasks at once; the ClientApps run on actors, which get workers of their own, so
    # those idle workers only cost their start: off, a run's Ray processes use ~2-3 CPU-s less and it starts ~1-2 s
    # sooner on 2 cores (process accounting over a 3-client run, 3 starts each way, 2026-12-01)
    os.environ.setdefault("RAY_enable_worker_prestart", "0")
    os.environ.setdefault("RAY_prestart_worker_first_driver", "0")
    warnings.filterwarnings("ignore", category=FutureWarning, module="ray")
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}


def _start_ray(backend: dict) -> None:
    """Ray started as Flower's Simulation Engine starts it (its own ``RayBackend``, the same settings), before the
    engine, whose backend then finds it running: so that :func:`_stop_on_signals` can replace the SIGTERM handler
    that ``ray.init`` installs."""
    from flwr.server.superlink.fleet.vce.backend.raybackend import RayBackend

    RayBackend(backend)


def _stop_on_signals(holder: dict) -> None:
    """SIGTERM and Ctrl-C (main thread only) stop the ServerApp at its next exchange with the nodes, and the
    Simulation Engine then stops as after a finished run (its ClientApps finish what they compute); a second signal
    stops the process at once (:func:`hetfed.processes.exit_now`: each run marked failed, exit status 128 + the
    signal's number; Ray's processes end with it).

    Why not raise in the main thread, as elsewhere in hetfed: there the exception ends Flower's wait for its workers,
    and Flower's backend shuts Ray down while a worker is still in ``ray.get`` for a ClientApp's reply; Ray then ends
    the whole process with exit status 1 ("The core worker has already been shutdown") instead of 143 or 130 — seen
    in CI, and reproduced (1 in 8 under load) with every thread's stack at Ray's exit: a worker in Flower's
    ``fetch_result_and_return_actor_to_pool``, the main thread in ``RayBackend.terminate``'s ``ray.shutdown``."""
    from hetfed.flower.exchange import abandon

    def handler(signum: int, _frame: object) -> None:
        why = Terminated(signum) if signum == signal.SIGTERM else KeyboardInterrupt()
        if "stop" in holder:  # not raised here either (Flower's stop would follow): the run marked failed, then out
            _kill_descendants()
            exit_now(128 + signum, why, f"{interruption_reason(why)} again: stopped at once, without waiting for "
                     "the ClientApps")
        holder["stop"] = why
        if "grid" in holder:
            abandon(holder["grid"], why)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, handler)


def _kill_descendants() -> None:
    """Every process below this one killed: Ray's, when it was started here (a cluster at ``flower.ray_address`` is
    not below it and stays). Ray's agents, orphaned by a raylet that died with this process, would otherwise wait a
    minute on its dead GCS before leaving (seen: 45 s and counting)."""
    signal_all(descendants(), signal.SIGKILL)


def _server_app(body: Callable[[object], T], holder: dict, log_file: Path | None, started: Callable[[], None]):
    """The ServerApp that runs ``body(grid)``, keeping its value or its error in ``holder`` for the caller."""
    from flwr.serverapp import Grid, ServerApp

    from hetfed.flower.exchange import abandon

    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context) -> None:
        me = threading.current_thread()
        holder.update(started=True, grid=grid, thread=me)
        if "stop" in holder:  # a signal came while the engine started (:func:`_stop_on_signals`)
            abandon(grid, holder["stop"])
        started()
        try:
            value = body(grid)
            if holder.get("thread") is me:  # not a ServerApp abandoned for a retry (:func:`_abandon`)
                holder["value"] = value
        except BaseException as err:  # kept for the caller: Flower would log it and go on shutting down
            if holder.get("thread") is me:
                holder["error"] = err
            if log_file is not None:  # the traceback for whoever debugs it; the console gets one line
                with open(log_file, "a", encoding="utf-8") as fh:
                    fh.write(f"hetfed's ServerApp failed:\n{traceback.format_exc()}\n")

    return server_app


def _outcome(holder: dict, where: str):
    """The ServerApp's value, or its failure as one line (hetfed's own errors and Ctrl-C as they were); a signal's
    stop whatever the ServerApp did after it."""
    if "stop" in holder:
        raise holder["stop"]
    if "error" in holder:
        err = holder["error"]
        if isinstance(err, HetfedError | KeyboardInterrupt):
            raise err
        raise RunError(f"Flower's ServerApp failed: {type(err).__name__}: {err}{where}") from err
    if "value" not in holder:
        raise RunError(f"the Flower simulation ended without a result{where}")
    return holder["value"]


#: Ray's start fails now and then on a loaded machine ("GCS has become overloaded") before any of hetfed's
#: code has run; then the simulation is started again, at most this many times in all
START_ATTEMPTS = 3


def start_with_retries(start: Callable[[], object], started: Callable[[], bool], log_file: Path | None = None,
                       attempts: int = START_ATTEMPTS, reset: Callable[[], None] = lambda: None) -> None:
    """Run ``start`` (the Simulation Engine); if it fails or returns before the run ``started`` (:func:`_began`:
    nothing of the run has happened yet, so nothing is repeated), ``reset`` (the ServerApp that waited stops) and try
    again, each retry noted in the log. The ServerApp starts at once, beside Ray's ~30 s
    start, so its own start says nothing: a Ray that timed out starting had not been retried.

    A failure after the run started is never retried; the last attempt's failure is raised.
    """
    for attempt in range(1, attempts + 1):
        try:
            start()
            why = "it returned"  # Flower logged the failure and returned without running the ServerApp
        except Exception as err:
            if started() or attempt == attempts:
                raise
            why = f"{type(err).__name__}: {err}"
        if started() or attempt == attempts:
            return
        if log_file is not None:
            with open(log_file, "a", encoding="utf-8") as fh:
                fh.write(f"hetfed: the Simulation Engine ended before any node answered ({why}); "
                         f"starting it again (attempt {attempt + 1}/{attempts})\n")
        reset()
        _stop_ray()


def _log_to_file(path: Path | None) -> Callable[[], None]:
    """Flower's log lines into ``path`` (console: errors only); returns what undoes it."""
    logger = logging.getLogger("flwr")
    old_level, old_handlers = logger.level, [(h, h.level) for h in logger.handlers]
    for h, _ in old_handlers:  # Flower's colour-coded lines stay off the console: hetfed says what failed in
        h.setLevel(logging.CRITICAL if path is not None else logging.ERROR)  # one line; the file keeps them all
    handler = None
    if path is not None:
        handler = logging.FileHandler(path, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
    else:
        logger.setLevel(logging.ERROR)

    def restore() -> None:
        if handler is not None:
            logger.removeHandler(handler)
            handler.close()
        logger.setLevel(old_level)
        for h, level in old_handlers:
            h.setLevel(level)

    return restore


def _stop_ray() -> None:
    """Leave no Ray process behind, whatever ended the simulation (Flower shuts Ray down on success)."""
    try:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    except Exception:  # shutting down is best effort; a failure here must not hide the run's own error
        pass
