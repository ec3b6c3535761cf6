"""The registries' shared mechanism: components of one kind, each registered by its own module, found by
importing the modules of the kind's package — so nothing lists them (DESIGN: every component is one file)."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Generic, TypeVar

from pydantic import BaseModel, ValidationError

from hetfed.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """``package``'s components, by name; ``key`` is the config key that names one (for errors), ``hint`` what
    an error adds (where to look), ``exclude`` the package's modules that are not components (and every
    module whose name starts with ``_``)."""

    def __init__(self, package: str, key: str, hint: str = "", exclude: frozenset[str] = frozenset()):
        self.package, self.key, self.hint, self.exclude = package, key, hint, exclude
        self._items: dict[str, T] = {}
        self._discovered = False

    def register(self, name: str, item: T) -> T:
        self._items[name] = item
        return item

    def unregister(self, name: str) -> None:
        self._items.pop(name, None)

    def get_registered(self, name: str) -> T | None:
        """What is registered under ``name`` so far, without discovering the package (None: nothing)."""
        return self._items.get(name)

    def _discover(self) -> None:
        """Import the package's modules once: each registers what it defines."""
        if self._discovered:
            return
        self._discovered = True
        module = importlib.import_module(self.package)
        for info in pkgutil.iter_modules(module.__path__):
            if info.name not in self.exclude and not info.name.startswith("_"):
                importlib.import_module(f"{self.package}.{info.name}")

    def items(self) -> list[tuple[str, T]]:
        self._discover()
        return sorted(self._items.items())

    def names(self) -> list[str]:
        self._discover()
        return sorted(self._items)

    def get(self, name: str, where: str | None = None) -> T:
        self._discover()
        if name not in self._items:
            hint = f" {self.hint}" if self.hint else ""
            raise ConfigError(f"{where or self.key} = {name!r} is not allowed: expected one of "
                              f"{sorted(self._items)}{hint}")
        return self._items[name]


def describe_params(model: type[BaseModel]) -> list[dict[str, Any]]:
    """A component's parameters as plain data: name, default, type, bounds, description (``--json`` listings)."""
    params = []
    for key, f in model.model_fields.items():
        default = f.get_default(call_default_factory=True)
        if isinstance(default, BaseModel):
            default = default.model_dump(mode="json")
        bounds = {k: getattr(m, k) for m in f.metadata for k in ("gt", "ge", "lt", "le") if hasattr(m, k)}
        params.append({"name": key, "default": default, "type": _type_name(f.annotation), "bounds": bounds,
                       "description": f.description or ""})
    return params


def _type_name(annotation: Any) -> str:
    name = getattr(annotation, "__name__", None)
    return name if name and not hasattr(annotation, "__args__") else str(annotation).replace("typing.", "")


def params_error(err: ValidationError, where: str, unknown: str) -> str:
    """A component's parameters' validation errors as one line naming each key under ``where``; ``unknown`` says
    what an unknown key is told (which parameters the component has, or where to look)."""
    parts = []
    for e in err.errors():
        key = ".".join([where, *(str(p) for p in e["loc"])])
        if e["type"] == "extra_forbidden":
            parts.append(f"unknown key {key!r}: {unknown}")
            continue
        msg = e["msg"].removeprefix("Value error, ")
        parts.append(f"{key} = {e.get('input')!r}: {msg}")
    return "; ".join(parts)
