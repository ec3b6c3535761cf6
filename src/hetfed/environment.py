"""hetfed's settings read from the process environment (``HETFED_*``): each read one way, and a value that is not
allowed refused with a one-line error naming the variable, the value and what is allowed — never taken as the
default or as "set".

Why here and not in the config: these are settings of a process (a Flower node's, a worker's, a simulation's),
not of a run; a node reads them from its own environment, where the run's config does not reach.
"""

from __future__ import annotations

import os

from hetfed.errors import ConfigError
from hetfed.spelling import did_you_mean

ON, OFF = ("1", "true", "yes", "on"), ("0", "false", "no", "off")

#: every variable hetfed reads, and what it sets (``docs/flower.md`` and ``docs/scale.md`` say more); any other
#: ``HETFED_*`` is refused by :func:`refuse_unknown` — a mistyped one would otherwise be a setting silently ignored.
#: ``HETFED_TEST_*`` belongs to the test suite, which hetfed does not read.
VARIABLES = {
    "HETFED_CACHE": "where embeddings and a node's federations are cached (default ~/.cache/hetfed)",
    "HETFED_DATA": "a folder of datasets' files: each dataset's in HETFED_DATA/<name>, after dataset.data_dir",
    "HETFED_MALLOC": "off: leave glibc's allocator as it is (default: keep the memory a round frees)",
    "HETFED_CLIENT_THREADS": "the threads a Flower node computes its clients with (default 1)",
    "HETFED_FLOWER_WORKER": "off: a deployment's node runs every message in its ClientApp's own process",
    "HETFED_WORKER_DIR": "where a node's worker keeps its pid, lock and log files",
    "HETFED_WORKER_IDLE": "seconds a node's worker waits for a message before it exits (default 600)",
    "HETFED_FLOWER_WIRE_LOG": "a file a node logs what leaves it to (its audit log)",
    "HETFED_FLOWER_TIMING": "a file a node and the server log where each message's time went to",
}


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


def refuse_unknown() -> None:
    """A ``HETFED_*`` variable of this process that hetfed does not read (:data:`VARIABLES`; ``HETFED_TEST_*``
    aside) refused in one line that names it, its value, the variable it most likely meant and every one hetfed
    reads."""
    prefix = "HETFED_"
    for name in sorted(os.environ):
        if name.startswith(prefix) and not name.startswith(f"{prefix}TEST_") and name not in VARIABLES:
            meant = did_you_mean(name.removeprefix(prefix), [v.removeprefix(prefix) for v in VARIABLES], prefix)
            raise ConfigError(f"{name} = {os.environ[name]!r} is not a variable hetfed reads: {meant}"
                              f"expected one of {', '.join(sorted(VARIABLES))} (or unset it)")
