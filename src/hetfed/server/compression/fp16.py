"""Half-precision transport: the update cast to IEEE float16 (2 bytes a value) and back."""

from __future__ import annotations

import torch

from hetfed.server.compression import casting, register

register(casting("fp16", torch.float16, "the update in float16 (round to nearest; 2 bytes a value)"))
