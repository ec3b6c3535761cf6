"""``deployment``: a real Flower federation — this process is the ServerApp a SuperLink started, the clients are
the SuperNodes connected to it (``hetfed flower``). Not chosen by ``train.executor``: the ServerApp hands the
driver this kind bound to its Grid (:meth:`Deployment.on`), and every method of the run trains on that
federation, whatever its ``train.executor`` says."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from hetfed.config import Config
from hetfed.errors import RunError
from hetfed.executors.kinds import ClientSteps, ExecutorKind, Opening, Session, register

T = TypeVar("T")


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
