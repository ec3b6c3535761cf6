"""Many evaluations summarised at once (:func:`hetfed.engine.summary.summaries`, a stacked sweep's runs) give every
number :func:`summarise` gives each alone, to the bit: any number of clients, NaN reports, clients without
validation data or test weight, opted-out clients, binary tasks and reports besides the plain ones."""

from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hetfed.engine.summary import Reports, summaries, summarise

#: values a client's report may take: accuracies in [0, 1] or sums; NaN (nothing measured) in some evaluations
clean = st.one_of(st.floats(0, 1), st.floats(0, 50))
value = st.one_of(clean, st.just(math.nan))


@st.composite
def evaluation(draw, k: int, keys: frozenset[str], n_classes: int) -> Reports:
    plain = draw(st.booleans())  # no NaN, every client weighted, none opted out: what is summarised as arrays
    reports: dict[str, list] = {key: draw(st.lists(clean if plain else value, min_size=k, max_size=k))
                                for key in ("local_accuracy", "local_loss", "val_accuracy", "val_loss_sum", "val_loss")}
    reports["val_n"] = draw(st.lists(st.integers(0, 40), min_size=k, max_size=k))
    if "local_n" in keys:
        reports["local_n"] = draw(st.lists(st.integers(1 if plain else 0, 40), min_size=k, max_size=k))
    if "mean.gate" in keys:
        reports["mean.gate"] = draw(st.lists(value, min_size=k, max_size=k))
    if n_classes == 2:
        reports["local_auc"] = draw(st.lists(value, min_size=k, max_size=k))
    opted = (np.array(draw(st.lists(st.booleans(), min_size=k, max_size=k))) if not plain and draw(st.booleans())
             else np.zeros(k, bool))
    server = {"global_accuracy": draw(st.floats(0, 1)), "global_loss": draw(st.floats(0, 9))}
    return Reports(reports, list(range(k)), opted, n_classes, server)


@st.composite
def evaluations(draw) -> list[Reports]:
    out = []
    for _ in range(draw(st.integers(1, 4))):  # groups of one shape, and evaluations of other shapes among them
        k = draw(st.integers(1, 40))
        keys = draw(st.sampled_from([frozenset({"local_n"}), frozenset(), frozenset({"local_n", "mean.gate"})]))
        n_classes = draw(st.sampled_from([10, 10, 2]))
        out += [draw(evaluation(k, keys, n_classes)) for _ in range(draw(st.integers(1, 6)))]
    return draw(st.permutations(out))


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))


@settings(max_examples=150, deadline=None)
@given(evaluations())
def test_summaries_at_once_equal_each_alone_to_the_bit(evals):
    together = summaries(evals)
    for e, ev in zip(evals, together, strict=True):
        alone = summarise(e.reports, e.ids, e.opted_out, e.n_classes, e.server)
        assert list(ev.metrics) == list(alone.metrics)  # the same rows, in metrics.csv's order
        for key, number in alone.metrics.items():
            assert _same(ev.metrics[key], number), (key, ev.metrics[key], number)
        assert ev.per_client == alone.per_client


def test_evaluations_of_one_shape_without_nan_are_summarised_as_arrays(monkeypatch):
    """The at-once path is taken (not every row alone): a summary alone is never asked for."""
    rng = np.random.default_rng(0)
    evals = [Reports({"local_accuracy": rng.random(12).tolist(), "local_loss": rng.random(12).tolist(),
                      "local_n": rng.integers(1, 9, 12).tolist(), "val_accuracy": rng.random(12).tolist(),
                      "val_loss_sum": rng.random(12).tolist(), "val_n": rng.integers(0, 9, 12).tolist()},
                     list(range(12)), np.zeros(12, bool), 10) for _ in range(5)]
    expected = [e.summary() for e in evals]
    monkeypatch.setattr(Reports, "summary", lambda self: (_ for _ in ()).throw(AssertionError("alone")))
    for ev, alone in zip(summaries(evals), expected, strict=True):
        assert ev.metrics == alone.metrics
