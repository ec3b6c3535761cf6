"""DP-FedAvg's aggregate (McMahan et al. 2018): the clipped updates' mean plus Gaussian noise.

It takes the combine step's place when ``privacy.noise_multiplier`` is set (the screen has clipped every
update to norm S): uniform weighting divides the sum of clipped updates by the *expected* number of
clients m (the fixed-denominator estimator, so the sensitivity is S/m whoever replied) and adds
``N(0, (z·S/m)²)`` to every coordinate; sample weighting adds ``N(0, (z·S·max n_k/Σn)²)``. The noise is
drawn from the run seed's DP stream for the round (:func:`hetfed.engine.rng.derive_seed`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hetfed.engine.types import Params, Upload
from hetfed.server.combine.mean import weighted_mean


@dataclass(frozen=True)
class DPNoise:
    """The private aggregate: noise multiplier z, clip S, and uniform (1/m) or sample weighting."""

    noise_multiplier: float
    clip: float | None
    uniform: bool

    def aggregate(self, old: Params, upload: Upload, expected_clients: int, generator_seed: int) -> Params:
        mean = weighted_mean(old, upload, self.uniform)
        received = len(upload.client_ids)
        if self.uniform:
            scale = received / max(expected_clients, 1)
            std = self.noise_multiplier * (self.clip or 0.0) / max(expected_clients, 1)
        else:
            n = upload.num_samples.double()
            scale = 1.0
            std = self.noise_multiplier * (self.clip or 0.0) * float(n.max() / n.sum())
        gen = torch.Generator().manual_seed(generator_seed)
        avg = {}
        for k, v in old.items():
            avg[k] = mean[k] if scale == 1.0 else v + (mean[k] - v) * scale  # no noise, no clip: FedAvg exactly
            if std > 0:
                avg[k] = avg[k] + (torch.randn(v.shape, generator=gen, dtype=torch.float64) * std).to(v.device, v.dtype)
        return avg
