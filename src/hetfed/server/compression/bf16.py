"""bfloat16 transport: the update cast to bfloat16 (float32's range, 8 bits of mantissa; 2 bytes a value)."""

from __future__ import annotations

import torch

from hetfed.server.compression import casting, register

register(casting("bf16", torch.bfloat16, "the update in bfloat16 (round to nearest; 2 bytes a value)"))
