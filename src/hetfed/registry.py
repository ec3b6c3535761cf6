"""The registries' shared mechanism: components of one kind, each registered by its own module, found by
importing the modules of the kind's package — so nothing lists them (DESIGN: every component is one file)."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any, Generic, TypeVar

from pydantic import BaseModel

from hetfed.errors import ConfigError

T = TypeVar("T")


class Registry(Generic[T]):
    """``package``'s components, by name; ``key`` is the config key that names one (for errors)."""

    def __init__(self, package: str, key: str):
        self.package, self.key = package, key
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T) -> T:
        self._items[name] = item
        return item

    def unregister(self, name: str) -> None:
        self._items.pop(name, None)

    def _discover(self) -> None:
        module = importlib.import_module(self.package)
        for info in pkgutil.iter_modules(module.__path__):
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
            raise ConfigError(f"{where or self.key} = {name!r} is not allowed: expected one of {sorted(self._items)}")
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
