"""What a round reads back after its server update (#74 §1): its clients' training loss and the server's parameters
that are not finite, asked as a request so that a stacked sweep reads every run's at once.

What a user relies on: the loss is the clients' losses weighted by their samples, and a run's numbers are the same
whichever runs' are read with it (a stacked sweep's runs.csv equals the one-by-one sweep's); a diverged server is
found (every parameter holding a NaN or ±inf named), and one whose values are finite is not, however large.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.engine.types import ServerState, Upload
from hetfed.executors.updates import ReadBack, read_back

SPECIAL = [0.0, 1.5, -2.0, 3e38, float("nan"), float("inf"), float("-inf")]


def _request(losses: list[float], sizes: list[float], params: dict[str, list[float]]) -> ReadBack:
    n = len(losses)
    upload = Upload(list(range(n)), {}, torch.tensor(sizes), {"train_loss": torch.tensor(losses)}) if n else None
    return ReadBack(upload, ServerState({k: torch.tensor(v, dtype=torch.float32) for k, v in params.items()}, 3))


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.lists(st.floats(0, 10, width=32), max_size=6), st.integers(0, 3),
                          st.dictionaries(st.sampled_from(["w", "b", "head.w"]),
                                          st.lists(st.sampled_from(SPECIAL), min_size=1, max_size=4), max_size=3)),
                min_size=1, max_size=5))
def test_each_runs_reads_are_its_own_whichever_runs_are_read_with_it(runs):
    """Runs of a few clients each (sample counts 0–8, all zero for some), servers with NaN, ±inf and huge values."""
    asked = []
    for losses, size_seed, params in runs:
        sizes = [float((size_seed * 37 + 11 * k) % 9) for k in range(len(losses))]
        asked.append(_request(losses, sizes, params))
    together = read_back(asked)
    for request, (loss, bad) in zip(asked, together, strict=True):
        alone_loss, alone_bad = read_back([request])[0]
        assert (loss, bad) == (alone_loss, alone_bad)
        assert bad == [k for k, v in request.server.params.items() if not bool(torch.isfinite(v).all())]
        upload = request.upload
        if upload is None:
            assert loss is None
            continue
        w = upload.num_samples.double().numpy()
        values = upload.extra["train_loss"].double().numpy()
        want = (values * w).sum() / w.sum() if w.sum() > 0 else values.mean()
        assert loss == float(want)


def test_a_server_of_huge_finite_values_has_not_diverged():
    """Its norm overflows float32 (→ inf): the values themselves are then checked, and they are finite."""
    (_, bad), = read_back([ReadBack(None, ServerState({"w": torch.full((100,), 3e38)}, 1))])
    assert bad == []
