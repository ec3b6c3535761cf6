"""When would a pytest-xdist run of the given tests end, from each test's CPU in a serial profile (``syscpu.py``)?

Files are handed to ``workers`` workers whole, in the given order (``--dist loadfile``), each worker running its
file to the end before taking the next; the workers share ``cores`` cores (each runs at ``cores / busy`` of a core
when more are busy than there are cores). Compares the order pytest collects (hetfed's conftest) with the longest
file first and with the ideal (all CPU spread evenly)::

    python -m pytest --collect-only -q -n 0 -m slow | grep :: > order.txt
    python order_sim.py syscpu.jsonl order.txt
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path


def makespan(files: list[str], cost: Counter, workers: int = 3, cores: int = 2) -> float:
    """Seconds until the last worker finishes, each file taking its CPU-seconds at one core's speed."""
    queue, left, running, now = list(files), [0.0] * workers, [False] * workers, 0.0
    while True:
        for w in range(workers):
            if not running[w] and queue:
                left[w], running[w] = cost[queue.pop(0)], True
        busy = [w for w in range(workers) if running[w]]
        if not busy:
            return now
        speed = min(1.0, cores / len(busy))
        step = min(left[w] for w in busy) / speed
        now += step
        for w in busy:
            left[w] -= step * speed
            running[w] = left[w] > 1e-9


def main(profile: str, order: str) -> None:
    cpu = {row["id"]: row["cpu"] for row in map(json.loads, Path(profile).read_text().splitlines())}
    ids = [line.strip() for line in Path(order).read_text().splitlines() if "::" in line]
    cost: Counter = Counter()
    for test in ids:
        cost[test.split("::")[0]] += cpu.get(test, 0.0)
    files = list(dict.fromkeys(test.split("::")[0] for test in ids))
    print(json.dumps({"collected_order_s": round(makespan(files, cost)),
                      "longest_first_s": round(makespan(sorted(files, key=lambda f: -cost[f]), cost)),
                      "ideal_s": round(sum(cost.values()) / 2), "files": len(files),
                      "tests_without_a_profile": sum(test not in cpu for test in ids)}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
