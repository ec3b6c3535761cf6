"""Whether a process of this machine still runs — what a run directory's status, a local deployment and a node's
worker ask of the processes they watch (the lowest layer: the standard library only)."""

from __future__ import annotations

import os


def process_alive(pid: int) -> bool:
    """Whether the process runs: a zombie (killed, not yet reaped by its parent — a ServerApp killed under
    Flower's SuperExec stays one) is dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except OSError:  # no /proc (not Linux): the signal answered
        return True
