"""hetfed: federated learning on clients that are not alike (non-IID).

A run flows one way: load → embed → partition → measure heterogeneity → train
(algorithm driven by an executor) → report. The README describes the commands and
the config; ``docs/methods.md`` what each method sends off a client; ``docs/api.md``
this Python API::

    import hetfed
    config = hetfed.load_config("configs/default.yaml", {"train.rounds": 20})
    fed = hetfed.build_federation(config)      # the clients, Γ, label skew
    run = hetfed.run(config)                   # every configured method
    run.results(); run.curves("global_accuracy"); run.model("cgau").predict(x)

The names below are imported on first use, so ``import hetfed`` stays fast and
pulls in neither torch nor matplotlib.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

_API = ("Federation", "Model", "Run", "build_federation", "load_config", "open_run", "report", "run")
_SWEEP_API = ("Sweep", "open_sweep", "sweep", "sweep_dry_run")
_ERRORS = ("ConfigError", "DataError", "HetfedError", "RunError")
__all__ = [*_API, *_SWEEP_API, *_ERRORS, "__version__"]
#: the module each name is imported from, on first use
_OWNER = {**dict.fromkeys(_API, "api"), **dict.fromkeys(_SWEEP_API, "api_sweep"), **dict.fromkeys(_ERRORS, "errors")}

if TYPE_CHECKING:
    from hetfed.api import (  # noqa: F401
        Federation,
        Model,
        Run,
        build_federation,
        load_config,
        open_run,
        report,
        run,
    )
    from hetfed.api_sweep import Sweep, open_sweep, sweep, sweep_dry_run  # noqa: F401
    from hetfed.errors import ConfigError, DataError, HetfedError, RunError  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in _OWNER:
        from importlib import import_module

        return getattr(import_module(f"hetfed.{_OWNER[name]}"), name)
    raise AttributeError(f"module 'hetfed' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
