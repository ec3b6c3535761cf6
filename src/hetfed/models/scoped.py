"""A value set for the duration of a block, seen by the code the block calls on this thread: what a model's layers
read that their callers do not pass (the adapters of a stack's clients, the step that moves weights in the backward,
the layers DP-SGD records). A :class:`~contextvars.ContextVar` (each thread its own), set and put back by
:func:`bound`."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

V = TypeVar("V")


@contextmanager
def bound(var: ContextVar[Any], value: V) -> Iterator[V]:
    """``var`` holds ``value`` within the block, and what it held before after it."""
    token = var.set(value)
    try:
        yield value
    finally:
        var.reset(token)
