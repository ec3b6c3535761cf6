"""The C library's allocator set for a simulation: memory a round frees is kept for the next round's tensors.

Why: torch takes a CPU tensor's memory from ``malloc``. glibc serves a block above its mmap threshold (128 KiB at
first, raised as such blocks are freed, to 32 MiB at most) with fresh pages from the kernel, and hands the top of its
heap back to the kernel once more than its trim threshold (twice the mmap threshold) is free. A round makes and frees
the same tensors every time, so every round the kernel faulted in and zeroed fresh pages for them again: a stacked
sweep of 20 seeds of the default experiment took ~51 000 minor page faults a round (~200 MB), none once the heap keeps
what it frees (#74, ``results/benchmarks_cpu_2026-11-29h``). The numbers computed do not change: only where the
memory comes from.

What it costs: freed memory up to :data:`TRIM_THRESHOLD` stays with the process until it exits (its resident size
is its peak, up to that much more); blocks of more than :data:`MMAP_THRESHOLD` are still mapped and unmapped each
time. Only glibc's ``mallopt`` is set (Linux; elsewhere nothing is done). ``HETFED_MALLOC=off`` (or ``0``, ``false``,
``no``) keeps the C library's own settings, and so does any of glibc's own malloc settings in the environment
(:data:`GLIBC_SETTINGS`, or ``GLIBC_TUNABLES`` naming ``glibc.malloc``): a setting the user gave is never overridden
(``MALLOC_MMAP_THRESHOLD_=1048576`` keeps a very large federation's peak memory flat, ``docs/scale.md``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

from hetfed.environment import switch

#: the environment variable that turns it off
ENV = "HETFED_MALLOC"
#: blocks up to this size come from the heap (glibc's largest mmap threshold on a 64-bit system: a larger one is
#: refused)
MMAP_THRESHOLD = 32 << 20
#: the free top of the heap is handed back to the kernel beyond this much
TRIM_THRESHOLD = 1 << 30
#: glibc's ``mallopt`` parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: glibc's malloc settings read from the environment at start-up (any of them set: the user's, kept)
GLIBC_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_",
                  "MALLOC_ARENA_MAX", "MALLOC_ARENA_TEST")
_applied: bool | None = None


def wanted() -> bool:
    """Whether ``HETFED_MALLOC`` asks for the settings (unset: yes); any other value is refused."""
    return switch(ENV, True, "off keeps the C library's own allocator settings")


def keep_freed_memory() -> bool:
    """Set glibc's allocator to keep what a round frees, once a process (``HETFED_MALLOC`` is read, and refused
    when it is not allowed, at every call). True when the settings are in force; False with ``HETFED_MALLOC=off``
    at the first call, glibc settings of the user's (:func:`users_own`), or another C library."""
    global _applied
    on = wanted()
    if _applied is None:
        _applied = on and not users_own() and platform.libc_ver()[0] == "glibc" and _set()
    return _applied


def users_own() -> bool:
    """Whether the environment gives glibc malloc settings of its own."""
    return any(k in os.environ for k in GLIBC_SETTINGS) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", "")


def _set() -> bool:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    # the mmap threshold set by hand also stops glibc from moving either threshold by itself
    return bool(libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(_M_TRIM_THRESHOLD,
                                                                                       TRIM_THRESHOLD))
