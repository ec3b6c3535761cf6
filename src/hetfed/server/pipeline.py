"""The server chain of a method, from its ``server:`` section."""

from __future__ import annotations

from hetfed.config import PrivacyConfig, ServerConfig
from hetfed.server.chain import Chain, Combine, Optimize, PrivateMean, Rescale
from hetfed.server.combine import parse
from hetfed.server.dp import DPNoise
from hetfed.server.optimizers import optimizer_for
from hetfed.server.screen import ScreenSpec
from hetfed.server.transport import transport


def server_chain(server: ServerConfig, privacy: PrivacyConfig | None = None) -> Chain:
    """screen spec → combine rule → rescale → optimiser, and the uploads' transport (compression), as configured;
    with client-level DP on (``privacy.noise_multiplier`` set), DP-FedAvg's noised mean is the combine step —
    composed here, once."""
    screen = ScreenSpec(server.screen.norm_factor, server.screen.reference_clients)
    combine: Combine | PrivateMean = Combine(*parse(server.combine), bucket=server.combine.bucket)
    if privacy is not None and privacy.noise_multiplier is not None:
        combine = PrivateMean(DPNoise(privacy.noise_multiplier, privacy.clip, privacy.weighting == "uniform"))
    return Chain((combine, Rescale(), Optimize(optimizer_for(server))), screen, server.min_clients,
                 transport(server.compression))
