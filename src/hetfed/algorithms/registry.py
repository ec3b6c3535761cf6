"""The registry of algorithms: what each method is, declared as data by its own module.

An algorithm is one module under ``hetfed/algorithms/``. At its end it calls
:func:`register` with an :class:`AlgorithmSpec`: its config name, the class that
implements it, its parameters (a pydantic model: what ``methods[i].params`` may
hold, with defaults and ranges) and its :class:`Capabilities`. Nothing else lists
it: the registry finds the modules of this package itself (:func:`specs` imports
each on first use), and config validation, the runner, the API, the report, the
Flower apps, the parity tests and ``hetfed algorithms`` ask it.

This module imports no algorithm at import time, so the config layer can consult
it (:func:`check_method`) without an import loop: discovery happens when a spec
is first asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from hetfed.errors import ConfigError
from hetfed.interface import Capabilities
from hetfed.registry import Registry, describe_params, params_error

__all__ = ["AlgorithmParams", "AlgorithmSpec", "Capabilities", "NoParams", "get", "names", "register", "specs"]


class AlgorithmParams(BaseModel):
    """Base of an algorithm's own parameters: unknown keys are errors, like the rest of the config."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    @model_validator(mode="before")
    @classmethod
    def _onto_defaults(cls, data: Any) -> Any:
        """A section among the parameters given in part (FedMoE's ``params.optimizer: {lr: 5e-5}``) keeps the rest of
        its default (Adam), as the config's own sections do: validated alone, the part got the section's plain
        defaults (SGD with momentum 0.9) in place of the algorithm's."""
        if not isinstance(data, dict):
            return data
        defaults = {name: field.get_default(call_default_factory=True) for name, field in cls.model_fields.items()
                    if isinstance(data.get(name), dict)}
        return {**data, **{name: {**default.model_dump(), **data[name]} for name, default in defaults.items()
                           if isinstance(default, BaseModel)}}


class NoParams(AlgorithmParams):
    """An algorithm without parameters of its own."""


class PrivacyRow(NamedTuple):
    """One row of docs/methods.md's privacy table: what a method's upload holds and what stays on the client.

    Declared beside the algorithm (an algorithm with several faces, FedAvg with the CGAU model, has
    several rows); :func:`privacy_table` writes the table, and a test checks every row against what
    the algorithm's ``local_update`` really uploads.
    """

    method: str  # as the table names it
    config: str  # how to run it, e.g. "`algorithm: fedavg` + `model.kind: cgau`"
    params: str  # what Upload.params holds
    extra: str  # what Upload.extra holds, its fields in backticks
    stays: str  # what never leaves the client


#: the kinds of method, as the leaderboard and the docs group them
FAMILIES = ("global", "heterogeneity-specific", "personalised", "clustered", "prototype/contrastive")


@dataclass(frozen=True)
class AlgorithmSpec:
    """One registered algorithm."""

    name: str
    cls: type[Any]  # the Algorithm subclass
    summary: str
    paper: str
    params: type[AlgorithmParams] = NoParams
    capabilities: Capabilities = field(default_factory=Capabilities)
    #: where its parameters were set before the registry (an old top-level section, old ``train.*`` keys → param)
    legacy_section: str | None = None
    legacy_train: Mapping[str, str] = field(default_factory=dict)
    #: params that make a run of a few rounds quick (the parity tests, examples): e.g. fewer server steps
    quick: Mapping[str, Any] = field(default_factory=dict)
    #: the model a run of it needs when the default (an MLP) will not do (FedBN: a CNN with batch norm)
    model: Mapping[str, Any] = field(default_factory=dict)
    #: its rows of the privacy table (docs/methods.md), written by :func:`privacy_table`
    privacy: tuple[PrivacyRow, ...] = ()
    #: what kind of method it is (one of :data:`FAMILIES`): how the leaderboard and the docs group methods
    family: str = "global"
    #: where its paper appeared ("ICML 2021", "arXiv 2020"; "" for a baseline of no paper)
    venue: str = ""

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(
                f"algorithm {self.name!r}: family = {self.family!r}; expected one of {', '.join(FAMILIES)}"
            )

    def make_params(self, raw: Mapping[str, Any] | AlgorithmParams | None, where: str = "params") -> AlgorithmParams:
        """Validated parameters; an invalid value is a one-line ConfigError naming ``where``.key."""
        if isinstance(raw, self.params):
            return raw
        try:
            return self.params(**dict(raw or {}))
        except ValidationError as err:
            raise ConfigError(params_error(err, where, f"algorithm {self.name!r}", self.params,
                                           _REGISTRY.taken_by_others(self.name))) from None

    def describe(self) -> dict[str, Any]:
        """The spec as plain data (``hetfed algorithms --json``, generated docs)."""
        params = describe_params(self.params)
        caps = asdict(self.capabilities)
        caps["views"] = list(caps["views"])
        caps["model_kinds"] = list(caps["model_kinds"]) if caps["model_kinds"] is not None else None
        return {"name": self.name, "summary": self.summary, "paper": self.paper, "family": self.family,
                "venue": self.venue, "params": params,
                "capabilities": caps, "quick": dict(self.quick),
                **({"model": dict(self.model)} if self.model else {})}


#: every algorithm, by ``methods[i].algorithm`` (one module of this package each)
_REGISTRY: Registry[AlgorithmSpec] = Registry("algorithm", "hetfed.algorithms", "algorithm",
                                              hint="(see `hetfed algorithms`)", describe=lambda spec: spec.describe(),
                                              params_key="methods[i].params",
                                              exclude=frozenset({"registry", "build"}))


def register(spec: AlgorithmSpec) -> AlgorithmSpec:
    """Add an algorithm (called at the end of its module; tests may register toy algorithms too)."""
    old = _REGISTRY.get_registered(spec.name)
    if old is not None and old.cls is not spec.cls and old.cls.__qualname__ != spec.cls.__qualname__:
        raise ValueError(
            f"algorithm {spec.name!r} is registered twice ({old.cls.__module__} and {spec.cls.__module__})"
        )
    _REGISTRY.register(spec.name, spec)
    spec.cls.spec = spec
    return spec


def specs() -> list[AlgorithmSpec]:
    """Every registered algorithm, by name."""
    return [spec for _, spec in _REGISTRY.items()]


PRIVACY_HEADER = ("| method | config | `Upload.params` | `Upload.extra` | stays on the client |\n"
                  "|---|---|---|---|---|\n")


def privacy_table() -> str:
    """docs/methods.md's privacy table, from every shipped algorithm's :class:`PrivacyRow` (by name)."""
    rows = [row for spec in specs() if spec.cls.__module__.startswith("hetfed.") for row in spec.privacy]
    return PRIVACY_HEADER + "".join(f"| {' | '.join(row)} |\n" for row in rows)


def names() -> list[str]:
    return [s.name for s in specs()]


def get(name: str, where: str = "algorithm") -> AlgorithmSpec:
    """The spec of ``name``; an unknown name is a ConfigError listing the registered ones."""
    return _REGISTRY.get(name, where)


def with_capability(test: Callable[[Capabilities], bool]) -> list[str]:
    """Names of the algorithms whose capabilities pass ``test``."""
    return [s.name for s in specs() if test(s.capabilities)]
