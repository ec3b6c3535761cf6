"""User-facing error types.

Every failure a user can cause (bad config, missing files, impossible partition)
raises a :class:`HetfedError` subclass whose message says what is wrong and what
to do; the CLI prints it without a traceback and exits with status 2.
"""

from __future__ import annotations


class HetfedError(Exception):
    """Base class of all errors meant for the user, not the developer."""


class ConfigError(HetfedError, ValueError):
    """A configuration key has a value that is not allowed."""


class DataError(HetfedError):
    """A dataset cannot be found, read or used as asked."""


class PartitionError(HetfedError, ValueError):
    """The requested split of the data over clients cannot be made."""


class MissingExtraError(HetfedError, ImportError):
    """An optional dependency is needed; the message names the extra to install."""


class RunError(HetfedError):
    """A run cannot start or continue (e.g. its output directory is taken)."""


class HetfedNote(UserWarning):
    """Something a user should know about a setting that was applied (a deprecated key, a method's own
    value replaced by an override): the CLI prints it as one ``note:`` line on stderr."""


def bad_value(name: str, value: object, allowed: str) -> ConfigError:
    """Build the standard message: the parameter, the value and what is allowed."""
    return ConfigError(f"{name} = {value!r} is not allowed: expected {allowed}.")


class Terminated(KeyboardInterrupt):
    """The process was asked to stop by a signal (SIGTERM from a scheduler, ``timeout``,
    ``docker stop``): handled like Ctrl-C, so the run is marked failed, not left "running"."""

    def __init__(self, signum: int):
        import signal

        self.signum = signum
        super().__init__(f"terminated by {signal.Signals(signum).name}")


def interruption_reason(err: BaseException) -> str:
    """What status.json says about a run that stopped because of ``err``."""
    if isinstance(err, Terminated):
        return str(err)
    if isinstance(err, KeyboardInterrupt):
        return "interrupted (Ctrl-C)"
    if isinstance(err, SystemExit):  # Flower exits its ServerApp so when the run is stopped or the app signalled
        status = "" if err.code is None else f"status {err.code}; "
        return f"stopped: asked to exit ({status}on Flower: `flwr stop` or a signal to the ServerApp)"
    return f"{type(err).__name__}: {err}"
