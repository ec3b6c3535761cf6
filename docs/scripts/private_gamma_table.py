"""Γ from noised summaries (hetfed.gamma_summaries.private_gamma): its error and its interval's coverage against
the noise σ, the clip C and the client size, over independent releases. Prints the Markdown table of
docs/heterogeneity.md.

    OMP_NUM_THREADS=1 python docs/scripts/private_gamma_table.py [RELEASES]

Two settings: six Gaussian clients of n five-dimensional rows (shifted means and scales, ×0.3), and the
issue's real case — digits, Dirichlet α = 0.1, 10 clients of 15–250 rows (64 features).
"""

from __future__ import annotations

import sys

import numpy as np

from hetfed import gamma_summaries as gs


def gaussian_clients(n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(k * 0.3, 1 + 0.1 * k, size=(n, 5)) * 0.3 for k in range(6)]


def digits_clients() -> list[np.ndarray]:
    from hetfed.config import build_config
    from hetfed.pipeline import build_federation

    fed = build_federation(build_config({"partition": {"kind": "dirichlet", "alpha": 0.1, "min_size": 0}}),
                           progress=False).federation
    return [fed.x[fed.measured_rows(k, "train")] for k in range(fed.n_clients)]


def row(name: str, clients: list[np.ndarray], sigma: float, clip: float, releases: int) -> str:
    clean = [gs.summarise(x, clip) for x in clients]
    truth = gs.gamma_from_summaries(clean)
    rng = np.random.default_rng(1)
    got = [gs.private_gamma([gs.privatise(s, clip, sigma, rng) for s in clean], clip, sigma, seed=i)
           for i in range(releases)]
    est = np.array([g.gamma for g in got])
    raw = np.array([g.released for g in got])
    cover = np.mean([g.low <= truth <= g.high for g in got])
    sizes = sorted(len(x) for x in clients)
    size = f"{sizes[0]}" if sizes[0] == sizes[-1] else f"{sizes[0]}–{sizes[-1]}"
    return (f"| {name} | {size} | {sigma:g} | {clip:g} | {gs.summary_epsilon(sigma, 1e-5):.2f} | {truth:.4f} | "
            f"{np.mean(raw):.4f} ({100 * (np.mean(raw) / truth - 1):+.0f}%) | "
            f"{np.mean(est):.4f} ({100 * (np.mean(est) / truth - 1):+.0f}%) | "
            f"{np.mean([g.high - g.low for g in got]):.4f} | "
            f"{100 * cover:.0f}% | {got[0].min_client_size} | {got[0].clients_below} |")


def main() -> None:
    releases = int(sys.argv[1]) if len(sys.argv) > 1 else 100
    print(f"| clients | rows per client | σ | clip | ε (δ = 1e-5) | Γ without noise | Γ of the release (error) | "
          f"estimate (error) | interval width | coverage ({releases} releases) | min client size | clients below |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in (60, 150, 600, 2000):
        for sigma, clip in ((0.5, 1.0), (2.0, 1.0), (1.0, 2.0)):
            print(row("6 Gaussian, d = 5", gaussian_clients(n), sigma, clip, releases), flush=True)
    digits = digits_clients()
    for sigma, clip in ((0.05, 1.0), (2.0, 1.0), (2.0, 8.0)):
        print(row("digits, Dirichlet 0.1, d = 64", digits, sigma, clip, max(releases // 5, 10)), flush=True)


if __name__ == "__main__":
    main()
