"""``file``: each client's seconds per sample (and optionally its bandwidths) read from a CSV."""

from __future__ import annotations

from pydantic import Field

from hetfed.engine.latency import LatencyModel, register
from hetfed.registry import ComponentParams


class FileParams(ComponentParams):
    file: str = Field(description="a CSV with a header and one row per client: client, sample_seconds, and "
                      "optionally uplink_mbps, downlink_mbps")


register(LatencyModel("file", "each client's speeds read from a CSV", FileParams, reads_file=True))
