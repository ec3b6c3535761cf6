"""Flower's ``flwr-clientapp`` process, started without the SuperNode's command line.

A SuperNode starts one ``flwr-clientapp`` process per message (Flower's design). Flower's executable is
``flwr.supernode.cli:flwr_clientapp``, and importing it runs ``flwr/supernode/cli/__init__.py``, which imports the
SuperNode's own command — SQLAlchemy, Alembic, uvicorn — that a ClientApp never runs: on a 2-core machine ~0.55 of
the ~1.5 CPU-s the process spends importing before it talks to its SuperNode (``/usr/bin/time``, 2026-12-01).
:class:`~hetfed.flower.deploy.LocalDeployment` puts a
``flwr-clientapp`` that runs this file first on its SuperNodes' ``PATH``: Flower's own ``flwr_clientapp()``, with
the same arguments, its package present but that package's ``__init__`` not run.

Run as a script, never imported by hetfed; it imports nothing of hetfed (the ClientApp it starts loads hetfed's).
"""

from __future__ import annotations

import importlib.util
import sys
import types


def without_supernode_cli() -> None:
    """``flwr.supernode.cli`` as a bare package (its submodules importable, its ``__init__`` not run)."""
    spec = importlib.util.find_spec("flwr.supernode.cli")
    if spec is None or spec.submodule_search_locations is None:
        raise ImportError("flwr.supernode.cli is not a package in this Flower: expected flwr 1.42")
    package = types.ModuleType(spec.name)
    package.__path__ = list(spec.submodule_search_locations)
    package.__spec__ = spec
    sys.modules.setdefault(spec.name, package)


def main() -> None:
    without_supernode_cli()
    from flwr.supernode.cli.flwr_clientapp import flwr_clientapp

    flwr_clientapp()


if __name__ == "__main__":
    main()
