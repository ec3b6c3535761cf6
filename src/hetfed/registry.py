"""The registries' shared mechanism: components of one kind, each registered by its own module, found by
importing the modules of the kind's package — so nothing lists them (DESIGN: every component is one file)."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Generic, TypeVar

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

    def names(self) -> list[str]:
        self._discover()
        return sorted(self._items)

    def get(self, name: str, where: str | None = None) -> T:
        self._discover()
        if name not in self._items:
            raise ConfigError(f"{where or self.key} = {name!r} is not allowed: expected one of {sorted(self._items)}")
        return self._items[name]
