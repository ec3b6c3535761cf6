"""LeNet-style CNN: conv 6 → conv 16 → fc 120 → fc 84 → classes.

For 28×28 grayscale (MNIST, Fashion-MNIST) and 32×32 colour (CIFAR-10). The
first convolution pads by 2, as LeNet-5 does on MNIST; the second pads only
when the image is too small for a valid 5×5 convolution (e.g. 8×8 digits).
Convolutions have no cheap batched-over-clients form, so the per-client forward
is vectorised over the client axis with ``torch.func.vmap``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.func import vmap

from hetfed.errors import ConfigError
from hetfed.models.base import Model, Noise, Params, ParamSpec, fan_in_init


class LeNet(Model):
    def __init__(self, input_shape: Sequence[int], n_classes: int):
        shape = tuple(input_shape)
        if len(shape) == 2:
            h, w, c = shape[0], shape[1], 1
        elif len(shape) == 3 and shape[2] in (1, 3):
            h, w, c = shape
        else:
            raise ConfigError(
                f"model.kind = 'cnn' is not allowed for inputs of shape {shape}: expected images "
                "(H×W or H×W×3) with embed.kind = 'identity'"
            )
        if min(h, w) < 8:
            raise ConfigError(f"model.kind = 'cnn' needs images of at least 8×8, got {h}×{w}")
        self.h, self.w, self.c = h, w, c
        self.n_classes = n_classes
        s = min(h, w) // 2  # after conv1 (pad 2) and pool
        self.pad2 = 0 if s >= 10 else 2
        s = (s - 4 + 2 * self.pad2) // 2
        flat = 16 * s * s
        self._specs = [
            ParamSpec("conv1.weight", (6, c, 5, 5), fan_in_init(c * 25)),
            ParamSpec("conv1.bias", (6,), fan_in_init(c * 25)),
            ParamSpec("conv2.weight", (16, 6, 5, 5), fan_in_init(150)),
            ParamSpec("conv2.bias", (16,), fan_in_init(150)),
            ParamSpec("fc1.weight", (120, flat), fan_in_init(flat)),
            ParamSpec("fc1.bias", (120,), fan_in_init(flat)),
            ParamSpec("fc2.weight", (84, 120), fan_in_init(120)),
            ParamSpec("fc2.bias", (84,), fan_in_init(120)),
            ParamSpec("fc3.weight", (n_classes, 84), fan_in_init(84)),
            ParamSpec("fc3.bias", (n_classes,), fan_in_init(84)),
        ]

    def specs(self) -> list[ParamSpec]:
        return self._specs

    def _one(self, p: Params, x: torch.Tensor) -> torch.Tensor:
        if self.c == 1:
            x = x.reshape(-1, 1, self.h, self.w)
        else:
            x = x.reshape(-1, self.h, self.w, self.c).permute(0, 3, 1, 2)
        x = F.max_pool2d(F.relu(F.conv2d(x, p["conv1.weight"], p["conv1.bias"], padding=2)), 2)
        x = F.max_pool2d(F.relu(F.conv2d(x, p["conv2.weight"], p["conv2.bias"], padding=self.pad2)), 2)
        x = x.flatten(1)
        x = F.relu(F.linear(x, p["fc1.weight"], p["fc1.bias"]))
        x = F.relu(F.linear(x, p["fc2.weight"], p["fc2.bias"]))
        return F.linear(x, p["fc3.weight"], p["fc3.bias"])

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        return vmap(self._one)(params, x)

    def activation_floats(self, batch: int) -> int:
        return 3 * batch * (6 * self.h * self.w + 16 * self.h * self.w // 4 + 400)
