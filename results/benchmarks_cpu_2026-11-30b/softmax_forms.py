"""A step's log-softmax and softmax over 10 classes on this CPU, five ways (µs a call, best of 3 × 1 000 calls):
A padded to 16 with −inf, then the exponential of the padded result (hetfed before 2026-11-30b); B torch's own,
unpadded (what hetfed does now below AVX-512); C padded, its own softmax; D padded, the exponential of the contiguous
10 columns; E torch's log_softmax and softmax, each its own.

    python results/benchmarks_cpu_2026-11-30b/softmax_forms.py
"""

import time

import torch
import torch.nn.functional as F

NEG = float("-inf")


def form_a(x):
    logp = torch.log_softmax(F.pad(x, (0, 6), value=NEG), -1)
    return logp[..., :10], logp.exp()[..., :10]


def form_b(x):
    logp = torch.log_softmax(x, -1)
    return logp, logp.exp()


def form_c(x):
    wide = F.pad(x, (0, 6), value=NEG)
    return torch.log_softmax(wide, -1)[..., :10], torch.softmax(wide, -1)[..., :10]


def form_d(x):
    logp = torch.log_softmax(F.pad(x, (0, 6), value=NEG), -1)[..., :10].contiguous()
    return logp, logp.exp()


def form_e(x):
    return torch.log_softmax(x, -1), torch.softmax(x, -1)


def main() -> None:
    torch.set_num_threads(2)
    forms = {"A": form_a, "B": form_b, "C": form_c, "D": form_d, "E": form_e}
    for shape in [(200, 32, 10), (7200, 10), (20, 360, 10), (10, 32, 10)]:
        x = torch.randn(*shape)
        best: dict[str, float] = {}
        for _ in range(3):
            for name, form in forms.items():
                form(x)
                t0 = time.perf_counter()
                for _ in range(1000):
                    form(x)
                best[name] = min(best.get(name, 1e9), time.perf_counter() - t0)
        print(shape, " ".join(f"{name}={us * 1e3:.0f}" for name, us in best.items()))


if __name__ == "__main__":
    main()
