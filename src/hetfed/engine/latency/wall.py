"""``wall``: no model — an asynchronous server on Flower merges replies in the order they really come, and
sim_time is the run's seconds."""

from hetfed.engine.latency import LatencyModel, register

register(LatencyModel("wall", "no model: replies merged in the order they really come (asynchronous, on Flower)",
                      wall=True))
