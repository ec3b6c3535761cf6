"""hetfed's settings read from the process environment (``HETFED_*``): each read one way, and a value that is not
allowed refused with a one-line error naming the variable, the value and what is allowed — never taken as the
default or as "set".

Why here and not in the config: these are settings of a process (a Flower node's, a worker's, a simulation's),
not of a run; a node reads them from its own environment, where the run's config does not reach.
"""

from __future__ import annotations

import os

from hetfed.errors import ConfigError

ON, OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def switch(name: str, default: bool, why_off: str = "") -> bool:
    """Whether ``name`` is on: one of :data:`ON` or :data:`OFF` (any case, spaces around ignored); unset or empty:
    ``default``. ``why_off`` ends the error (what off means)."""
    value = os.environ.get(name, "").strip().lower()
    if not value:
        return default
    if value not in ON + OFF:
        raise ConfigError(f"{name} = {os.environ[name]!r} is not allowed: expected one of {', '.join(ON + OFF)}"
                          f"{f' ({why_off})' if why_off else ''}")
    return value in ON


def positive(name: str, default: float, integer: bool = False) -> float:
    """``name``'s value, a number above zero (a whole number when ``integer``); unset or empty: ``default``."""
    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = int(text) if integer else float(text)
    except ValueError:
        value = 0
    if not value > 0:
        raise ConfigError(f"{name} = {os.environ[name]!r} is not allowed: expected a "
                          f"{'whole number' if integer else 'number'} above 0")
    return value


def count(name: str, default: int) -> int:
    """``name``'s value, a whole number of at least 1 (threads, processes); unset or empty: ``default``."""
    return int(positive(name, default, integer=True))
