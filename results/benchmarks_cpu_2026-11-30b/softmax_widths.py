"""torch's CPU log-softmax of 7 200 rows by number of classes, unpadded and padded with −inf to 8 and 16 columns
(µs a call, best of 3 × 500), and the CPU capability torch reports.

    python results/benchmarks_cpu_2026-11-30b/softmax_widths.py
"""

import time

import torch
import torch.nn.functional as F

torch.set_num_threads(2)
print(torch.backends.cpu.get_cpu_capability())
for c in [2, 5, 7, 8, 10, 12, 15, 16]:
    x = torch.randn(7200, c)
    res = {}
    for to in [None, 8, 16]:
        if to is not None and to < c:
            continue
        w = x if to is None else F.pad(x, (0, to - c), value=float("-inf"))
        torch.log_softmax(w, -1)
        best = 1e9
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(500):
                torch.log_softmax(w, -1)
            best = min(best, (time.perf_counter() - t0) / 500 * 1e6)
        res[to] = round(best)
    print(c, res)
