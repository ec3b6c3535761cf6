"""What a round's batch plan costs (``hetfed.engine.step_plan.plan_steps``): every client's batches drawn, sorted and
gathered into pool indices, for stacks of ``--clients`` clients of unequal sizes (20–259 samples, B = ``--batch``,
one epoch), its layout kept from the round before as in a run. Prints JSON: microseconds per plan, the fastest of
``--repeats`` batches of ``--plans`` plans, one torch thread. Timings are never asserted; to compare two versions,
run it under each one's ``PYTHONPATH`` in turn.

    python benchmarks/plan_cost.py [--clients 10 200] [--batch 32] [--plans 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import timeit

import numpy as np
import torch

from hetfed.engine.local import LocalSchedule
from hetfed.engine.step_plan import plan_steps
from hetfed.engine.types import ClientData


def plan_microseconds(clients: int, batch: int, plans: int, repeats: int) -> float:
    """The fastest batch's microseconds per plan of ``clients`` unequal clients (their layout kept)."""
    rng = np.random.default_rng(0)
    sizes = rng.integers(20, 260, clients)
    starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    total = int(sizes.sum())
    data = ClientData(list(range(clients)), torch.zeros(total, 1), torch.zeros(total),
                      [np.arange(s, s + m) for s, m in zip(starts, sizes, strict=True)],
                      [int(s) for s in rng.integers(0, 2**62, clients)])
    schedule = LocalSchedule(epochs=1, batch_size=batch)
    cpu = torch.device("cpu")
    plan_steps(data, schedule, cpu)  # the layout, kept for the timed plans
    return min(timeit.repeat(lambda: plan_steps(data, schedule, cpu), number=plans, repeat=repeats)) / plans * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, nargs="+", default=[10, 200])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--plans", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    print(json.dumps({"batch": a.batch, "plans": a.plans, "repeats": a.repeats,
                      "us_per_plan": {str(n): round(plan_microseconds(n, a.batch, a.plans, a.repeats), 1)
                                      for n in a.clients}}, indent=1))


if __name__ == "__main__":
    main()
