"""``train.executor: flower`` — a hetfed run on Flower's Simulation Engine.

The server's round loop (:func:`hetfed.engine.simulate.simulate`) runs inside a
Flower ``ServerApp`` whose executor is a :class:`~hetfed.flower.executor.FlowerExecutor`;
the clients are hetfed's ``ClientApp`` on one virtual SuperNode per client
(``partition-id`` = client id). Nothing here is a second implementation of a
method: the ServerApp and the ClientApp run the same algorithm object.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from typing import TypeVar

from hetfed.flower import require_flwr

T = TypeVar("T")


def run_on_simulation(config, method: int, n_clients: int, body: Callable[[object], T]) -> T:
    """Start Flower's Simulation Engine with one SuperNode per client; ``body(executor)`` runs in the ServerApp."""
    require_flwr()
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation

    from hetfed.flower.client_app import app as client_app
    from hetfed.flower.executor import FlowerExecutor

    logging.getLogger("flwr").setLevel(logging.ERROR)  # run_simulation's deprecation notice: we know
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    warnings.filterwarnings("ignore", category=FutureWarning, module="ray")
    holder: dict[str, T] = {}
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context) -> None:
        holder["value"] = body(FlowerExecutor(grid, config, method))

    backend = {
        "client_resources": {"num_cpus": config.flower.client_cpus, "num_gpus": 0.0},
        "init_args": {"logging_level": "ERROR", "log_to_driver": False, "include_dashboard": False},
    }
    run_simulation(server_app, client_app, num_supernodes=n_clients, backend_config=backend)
    if "value" not in holder:
        from hetfed.errors import RunError

        raise RunError("the Flower simulation ended without a result (see the log above)")
    return holder["value"]
