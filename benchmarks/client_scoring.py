"""An evaluation's client scoring: n stacked logistic-regression clients score their test (10–59 samples each) and
validation (5–29) sets — each client's cross-entropy sum and correct predictions, read back once. Times
``hetfed.engine.evaluate.set_scores`` (or, with an older ``src/`` first on ``PYTHONPATH``, what it replaced:
``predict``'s per-client logits joined again by ``segment_scores``). Prints JSON; timings are never asserted::

    python benchmarks/client_scoring.py [--clients 10 200 1000] [--repeats 200]
"""

from __future__ import annotations

import argparse
import json
import timeit
from functools import partial

import numpy as np
import torch

from hetfed.config import build_config
from hetfed.engine import evaluate
from hetfed.models import build_model


def _score(model: object, params: dict, x: torch.Tensor, y: torch.Tensor, test: list, val: list) -> object:
    if hasattr(evaluate, "set_scores"):
        return evaluate.set_scores(model, params, x, y, [test, val])
    logits = [*evaluate.predict(model, params, x, test), *evaluate.predict(model, params, x, val)]  # the way before
    return evaluate.segment_scores(logits, y, [*test, *val])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 200, 1000])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    x, y = torch.randn(4000, 64), torch.randint(0, 10, (4000,))
    model = build_model(build_config({"model": {"kind": "logreg"}}).model, (64,), 10)
    shared = model.init_shared(torch.Generator().manual_seed(0))
    out = {"torch_threads": torch.get_num_threads(), "way": "set_scores" if hasattr(evaluate, "set_scores")
           else "predict + segment_scores", "us_per_scoring": {}}
    for n in args.clients:
        rng = np.random.default_rng(0)
        params = {k: v.unsqueeze(0).repeat(n, *([1] * v.ndim)) for k, v in shared.items()}
        test = [np.sort(rng.choice(4000, rng.integers(10, 60), replace=False)) for _ in range(n)]
        val = [np.sort(rng.choice(4000, rng.integers(5, 30), replace=False)) for _ in range(n)]
        score = partial(_score, model, params, x, y, test, val)
        score()
        out["us_per_scoring"][n] = round(timeit.timeit(score, number=args.repeats) / args.repeats * 1e6, 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
