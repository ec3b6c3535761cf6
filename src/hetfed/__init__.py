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

_API = ("Federation", "Model", "Run", "Sweep", "build_federation", "load_config", "open_run", "open_sweep",
        "report", "run", "sweep")
_ERRORS = ("ConfigError", "DataError", "HetfedError", "RunError")
__all__ = [*_API, *_ERRORS, "__version__"]

if TYPE_CHECKING:
    from hetfed.api import (  # noqa: F401
        Federation,
        Model,
        Run,
        Sweep,
        build_federation,
        load_config,
        open_run,
        open_sweep,
        report,
        run,
        sweep,
    )
    from hetfed.errors import ConfigError, DataError, HetfedError, RunError  # noqa: F401


def __getattr__(name: str) -> Any:
    if name in _API:
        from hetfed import api

        return getattr(api, name)
    if name in _ERRORS:
        from hetfed import errors

        return getattr(errors, name)
    raise AttributeError(f"module 'hetfed' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
