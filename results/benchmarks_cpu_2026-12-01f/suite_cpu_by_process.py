"""CPU seconds of every process on the machine by kind (pytest workers, Ray, Flower, hetfed subprocesses), read from
/proc every 0.5 s until the file STOP exists; writes OUT (JSON: totals by kind, the machine's busy CPU seconds, and
the same by kind every 30 s).

    python3 suite_cpu_by_process.py OUT STOP &  # then the suite; then: touch STOP

A process counts under the kind its command line says when last seen; one that lives less than 0.5 s may be missed,
and a process that was running before the start counts its whole life (the machine's own busy time is beside it).
"""

from __future__ import annotations

import collections
import json
import os
import sys
import time

TICK = os.sysconf("SC_CLK_TCK")
KINDS = [  # the first pattern found in a command line names its kind
    ("hetfed.flower.worker", "hetfed node worker"), ("flwr-clientapp", "flwr-clientapp"),
    ("flwr-serverapp", "flwr-serverapp"), ("flower-superlink", "superlink"), ("flower-supernode", "supernode"),
    ("superexec", "superexec"), ("/flwr ", "flwr CLI"), ("raylet", "ray"), ("gcs_server", "ray"), ("ray", "ray"),
    ("exec(eval(sys.stdin", "pytest worker"), ("hetfed", "hetfed subprocess"), ("pytest", "pytest"),
    ("python", "other python"),
]


def kind(cmdline: str) -> str:
    return next((name for pattern, name in KINDS if pattern in cmdline), "other")


def processes() -> dict[tuple[int, str], tuple[int, str]]:
    """(pid, start time) → (CPU ticks so far, kind) of every process now."""
    now = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rpartition(")")[2].split()
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmdline = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if cmdline:
            now[(int(pid), fields[19])] = (int(fields[11]) + int(fields[12]), kind(cmdline))
    return now


def machine_busy() -> int:
    with open("/proc/stat") as fh:
        ticks = [int(v) for v in fh.readline().split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4]  # all but idle and iowait


def main(out: str, stop: str) -> None:
    seen: dict[tuple[int, str], tuple[int, str]] = {}
    ended: collections.Counter[str] = collections.Counter()
    window: collections.Counter[str] = collections.Counter()
    timeline, busy0, start = [], machine_busy(), time.time()
    while not os.path.exists(stop):
        now = processes()
        for key, (ticks, name) in now.items():
            window[name] += ticks - seen.get(key, (0, name))[0]
        for key in seen.keys() - now.keys():
            ended[seen[key][1]] += seen[key][0]
        seen = now
        if time.time() - start >= 30 * (len(timeline) + 1):
            timeline.append({k: round(v / TICK, 1) for k, v in window.items() if v})
            window.clear()
        time.sleep(0.5)
    for ticks, name in seen.values():
        ended[name] += ticks
    with open(out, "w") as fh:
        json.dump({"cpu_s_by_kind": {k: round(v / TICK, 1) for k, v in ended.most_common()},
                   "machine_busy_cpu_s": round((machine_busy() - busy0) / TICK, 1),
                   "every_30_s": timeline}, fh, indent=1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
