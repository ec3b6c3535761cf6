"""``constant``: every client at the median speed."""

from hetfed.engine.latency import LatencyModel, register

register(LatencyModel("constant", "every client at the median speed"))
