"""The server chain of a method, from its ``server:`` section."""

from __future__ import annotations

from hetfed.config import ServerConfig
from hetfed.server.chain import Chain, Combine, Optimize, Rescale
from hetfed.server.combine import parse
from hetfed.server.optimizers import optimizer_for
from hetfed.server.screen import ScreenSpec
from hetfed.server.transport import transport


def server_chain(server: ServerConfig) -> Chain:
    """screen spec → combine rule → rescale → optimiser, and the uploads' transport (compression), as configured (``Chain.private`` puts DP-FedAvg's
    noised mean in the combine rule's place)."""
    screen = ScreenSpec(server.screen.norm_factor, server.screen.reference_clients)
    return Chain((Combine(*parse(server.combine)), Rescale(), Optimize(optimizer_for(server))), screen,
                 server.min_clients, transport(server.compression))
