"""Flower's executor kinds, registered on :data:`hetfed.executors.kinds.EXECUTORS` from here (the registry finds
this module through :data:`hetfed.registry.PROVIDERS`), so that ``executors/`` never imports ``flower/``:

- ``flower``: the clients are hetfed's ClientApp on Flower's Simulation Engine (one virtual SuperNode per
  ``flower.clients_per_node`` clients, on Ray); the server's round loop runs in a ServerApp and talks to them as
  Flower messages (:class:`~hetfed.flower.executor.FlowerExecutor`). One start of the engine serves every method
  of the session (Ray's start and stop cost seconds each).
- ``deployment``: a real Flower federation — this process is the ServerApp a SuperLink started, the clients are
  the SuperNodes connected to it (``hetfed flower``). Not chosen by ``train.executor``: the ServerApp hands the
  driver this kind bound to its Grid (:meth:`Deployment.on`), and every method of the run trains on that
  federation, whatever its ``train.executor`` says.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from hetfed.config import Config
from hetfed.errors import RunError
from hetfed.executors.kinds import ClientSteps, ExecutorKind, Opening, Session, register
from hetfed.flower import require_flwr

T = TypeVar("T")


@register
class FlowerSimulation(ExecutorKind):
    name = "flower"
    summary = "Flower's Simulation Engine: the clients are ClientApps on virtual SuperNodes (Ray), sent messages"
    in_process = False

    def check(self) -> None:
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
        from hetfed.flower.executor import FlowerExecutor
        from hetfed.flower.simulation import run_with_simulation_grid

        o = self.opening
        steps = partial(FlowerExecutor, simulated=True)
        return run_with_simulation_grid(o.config, o.n_clients, lambda grid: loop(partial(steps, grid, o.config)),
                                        log_file=o.log_file, status=o.status)


@register
class Deployment(ExecutorKind):
    name = "deployment"
    summary = ("a Flower deployment: this process is the ServerApp, the clients are the SuperNodes connected to its "
               "SuperLink (hetfed flower); handed to the run by the ServerApp")
    in_process = False
    selectable = False
    grid: Any = None

    @classmethod
    def on(cls, grid: Any) -> Deployment:
        """This kind bound to a ServerApp's Grid."""
        bound = cls()
        bound.grid = grid
        return bound

    @contextmanager
    def open(self, opening: Opening) -> Iterator[Session]:
        if self.grid is None:
            raise RunError("executor 'deployment' is opened by hetfed's ServerApp with its Grid (hetfed flower); "
                           "expected train.executor 'vectorised', 'sequential' or 'flower'")
        yield GridSession(self.grid, opening.config)


@dataclass(frozen=True)
class GridSession:
    grid: Any
    config: Config

    def run(self, loop: Callable[[ClientSteps], T]) -> T:
        from hetfed.flower.executor import FlowerExecutor

        return loop(partial(FlowerExecutor, self.grid, self.config))
