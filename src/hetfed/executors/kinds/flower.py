"""``flower``: the clients are hetfed's ClientApp on Flower's Simulation Engine (one virtual SuperNode per
``flower.clients_per_node`` clients, on Ray); the server's round loop runs in a ServerApp and talks to them as
Flower messages (:class:`~hetfed.flower.executor.FlowerExecutor`). One start of the engine serves every method
of the session (Ray's start and stop cost seconds each)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from hetfed.executors.kinds import ClientSteps, ExecutorKind, Opening, Session, register

T = TypeVar("T")


@register
class FlowerSimulation(ExecutorKind):
    name = "flower"
    summary = "Flower's Simulation Engine: the clients are ClientApps on virtual SuperNodes (Ray), sent messages"
    in_process = False

    def check(self) -> None:
        from hetfed.flower import require_flwr

        require_flwr()  # refused before any run directory when Flower is not installed

    @contextmanager
    def open(self, opening: Opening) -> Iterator[Session]:
        self.check()
        yield SimulationSession(opening)


@dataclass(frozen=True)
class SimulationSession:
    opening: Opening

    def run(self, loop: Callable[[ClientSteps], T]) -> T:
        """Start the engine, run ``loop`` in its ServerApp, stop it (Ray too, whatever happened)."""
        from hetfed.flower.simulation import run_with_simulation_grid

        o = self.opening
        return run_with_simulation_grid(o.config, o.n_clients, lambda grid: loop(_grid_steps(o, grid)),
                                        log_file=o.log_file, status=o.status)


def _grid_steps(opening: Opening, grid: Any) -> ClientSteps:
    from functools import partial

    from hetfed.flower.executor import FlowerExecutor

    return partial(FlowerExecutor, grid, opening.config, simulated=True)
