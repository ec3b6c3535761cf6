"""``wall``: no model, on an executor whose clients are elsewhere (Flower) — a synchronous round lasts its training
exchange's real seconds, an asynchronous server merges replies in the order they really come; sim_time is real seconds
(a synchronous run's rounds' summed, an asynchronous run's since it started). The clock of a federation of nodes with
their own data, whose clients' sizes the server does not know."""

from hetfed.engine.latency import LatencyModel, register

register(LatencyModel("wall", "no model: real exchanges timed (a round its exchange's seconds; asynchronous: replies "
                      "merged as they really come), on Flower", wall=True))
