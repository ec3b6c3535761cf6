"""The names of hetfed's own records in a Flower message, and reading a record's list — kept apart from
:mod:`hetfed.flower.records` (which converts tensors) so that the deployments' ClientApp process
(:mod:`hetfed.flower.lean_app`) reads them without importing torch."""

from __future__ import annotations

from typing import Any

#: the ConfigRecord that says which run and method a message belongs to
RUN = "hetfed.run"
#: the ConfigRecord naming the node's clients a step is for (``ids``) and every client the step evaluates (``among``)
CLIENTS = "hetfed.clients"
#: in a training message, the node's clients to score the received model first, before training on it (``ids``; and
#: ``among``: every client the evaluation scores) — round r's evaluation riding on round r + 1's training
EVALUATE_FIRST = "hetfed.evaluate_first"
#: in a personalisation message, the views to score after personalising (``views``) and which of the node's clients
#: score them (``at``: their places in the message's ``ids``) — the views' evaluations riding on personalisation
VIEWS_AFTER = "hetfed.views_after"
#: the records of a view's evaluation in a personalisation reply are named ``VIEW_RECORDS.format(view=…, name=…)``
VIEW_RECORDS = "hetfed.view.{view}.{name}"
#: the set-up query's request for the client's Γ summary (and the reply's record is "summary")
GAMMA = "hetfed.gamma"
#: in the run's first step message: the set-up query rides on it (the node says which clients it holds, then runs
#: the step for those of them the message names — the message names the step's clients, wherever they are held)
SETUP = "hetfed.setup"


def listed(value: object) -> list[Any]:
    """A record's list value (a record's values are typed as any of its kinds)."""
    if not isinstance(value, list):
        raise TypeError(f"expected a list in the record, found {type(value).__name__}")
    return value
