"""Two CNNs over a client axis: LeNet-style (conv 6 → conv 16 → fc 120 → fc 84 → classes,
``model.kind: cnn``) and McMahan et al.'s FedAvg CNN as PFLlib ships it (conv 32 → conv 64 →
fc 512 → classes, ``model.kind: cnn4``).

For 28×28 grayscale (MNIST, Fashion-MNIST) and 32×32 colour (CIFAR-10). The
first convolution pads by 2, as LeNet-5 does on MNIST; the second pads only
when the image is too small for a valid 5×5 convolution (e.g. 8×8 digits).
Convolutions have no cheap batched-over-clients form: on accelerators the
per-client forward is vectorised over the client axis with ``torch.func.vmap``
(grouped convolutions); on CPU a loop of plain convolutions is faster.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch.func import vmap

from hetfed.errors import ConfigError
from hetfed.models.base import Model, Noise, Params, ParamSpec, fan_in_init, ones_init, zeros_init


def _pool(x: torch.Tensor) -> torch.Tensor:
    """2×2 max-pooling (stride 2, odd edges dropped): ``F.max_pool2d(x, 2)``'s values, in the form that is
    fastest for what the call is for.

    Without autograd (evaluation) as three elementwise maxima, ~5× faster than ``F.max_pool2d`` on CPU (measured
    4.6 vs 27 ms on 2000 Fashion-MNIST feature maps; forward 0.13 vs 1.0 ms on a batch of 10 × 32 × 24 × 24).
    Under autograd (training) as ``F.max_pool2d``, whose backward is one pass where the maxima's is three: forward +
    backward 1.6 vs 3.6 ms on 10 × 32 × 24 × 24 (1.8 vs 4.6 ms for both of PFLlib's CNN's poolings, whose training
    step it made ~1.45× slower). The two differ only in how an exact tie inside a window shares its gradient (the
    maxima split it, ``max_pool2d`` gives it to one element). Pooling before the ReLU equals ReLU before pooling
    (both are monotone) on 4× fewer elements, and keeps ties to ties between raw convolution outputs instead of
    the many zeros a ReLU makes.
    """
    if torch.is_grad_enabled():
        return F.max_pool2d(x, 2)
    h, w = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2
    x = x[..., :h, :w]
    return torch.maximum(
        torch.maximum(x[..., 0::2, 0::2], x[..., 0::2, 1::2]),
        torch.maximum(x[..., 1::2, 0::2], x[..., 1::2, 1::2]),
    )


def _clients(params: Params) -> list[Params]:
    """Each client's parameters, by unbinding every stacked tensor once: autograd then returns the stack's
    gradient as one stack of the clients' (indexing ``v[i]`` per client would scatter each client's gradient into
    a zero tensor of the whole stack: m² work for a stack of m. Measured: PFLlib's CNN, 20 unequal clients of
    2 000 samples in stacks of ~2, B = 10, one CPU thread: 1.89 → 1.67 s per round)."""
    per = {k: v.unbind(0) for k, v in params.items()}
    return [{k: v[i] for k, v in per.items()} for i in range(len(next(iter(per.values()))))]


class LeNet(Model):
    KIND = "cnn"

    def __init__(self, input_shape: Sequence[int], n_classes: int):
        shape = tuple(input_shape)
        if len(shape) == 2:
            h, w, c = shape[0], shape[1], 1
        elif len(shape) == 3 and shape[2] in (1, 3):
            h, w, c = shape
        else:
            raise ConfigError(
                f"model.kind = {self.KIND!r} is not allowed for inputs of shape {shape}: expected images "
                "(H×W or H×W×3) with embed.kind = 'identity'"
            )
        if min(h, w) < 8:
            raise ConfigError(f"model.kind = {self.KIND!r} needs images of at least 8×8, got {h}×{w}")
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

    @property
    def head_names(self) -> tuple[str, ...]:
        return ("fc3.weight", "fc3.bias")
    @property
    def latent_dim(self) -> int:
        return 84

    pad1 = 2  # LeNet-5 pads its first convolution on MNIST

    def _convolved(self, p: Params, x: torch.Tensor) -> torch.Tensor:
        """One client's images through conv → ReLU∘pool twice, flattened."""
        if self.c == 1:
            x = x.reshape(-1, 1, self.h, self.w)
        else:
            x = x.reshape(-1, self.h, self.w, self.c).permute(0, 3, 1, 2)
        x = F.relu(_pool(F.conv2d(x, p["conv1.weight"], p["conv1.bias"], padding=self.pad1)))
        return F.relu(_pool(F.conv2d(x, p["conv2.weight"], p["conv2.bias"], padding=self.pad2))).flatten(1)

    def _features_one(self, p: Params, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(F.linear(self._convolved(p, x), p["fc1.weight"], p["fc1.bias"]))
        return F.relu(F.linear(x, p["fc2.weight"], p["fc2.bias"]))

    def features(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        return torch.stack([self._features_one(p, xi) for p, xi in zip(_clients(params), x.unbind(0), strict=True)])

    def head(self, params: Params, z: torch.Tensor) -> torch.Tensor:
        w, b = self.head_names
        return torch.baddbmm(params[b].unsqueeze(1), z, params[w].transpose(1, 2))

    def _one(self, p: Params, x: torch.Tensor) -> torch.Tensor:
        w, b = self.head_names
        return F.linear(self._features_one(p, x), p[w], p[b])

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        if x.device.type == "cpu":
            # vmap turns per-client weights into grouped convolutions, which CPU
            # kernels run slower than one plain convolution per client: 20
            # clients × 1000 images 999 vs 590 ms; a training step of 20 × 32
            # 103 vs 96 ms (forward + backward).
            return torch.stack([self._one(p, xi) for p, xi in zip(_clients(params), x.unbind(0), strict=True)])
        return vmap(self._one)(params, x)

    def activation_floats(self, batch: int) -> int:
        return 3 * batch * (6 * self.h * self.w + 16 * self.h * self.w // 4 + 400)

    def stacks_clients(self, device: str) -> bool:
        """A loop of plain convolutions on a CPU (see :meth:`forward`): PFLlib's CNN, 20 unequal clients of 24 000
        FMNIST-shaped samples, B = 10, 2 threads, trained 15.8 s a round in stacks and 13.9 s one at a time."""
        return device != "cpu"


class FedAvgCNN(LeNet):
    """McMahan et al. (2017)'s CNN in PFLlib's form (``FedAvgCNN``, its leaderboard model): 5×5 conv 32 →
    ReLU → 2×2 max-pool → 5×5 conv 64 → ReLU → 2×2 max-pool → fc 512 → ReLU → fc classes.

    Unpadded on 28×28 (fc input 1024, as PFLlib's ``dim=1024``) and 32×32×3 (1600); smaller images are
    padded by 2 where a valid convolution would not fit (8×8 digits: fc input 256).
    """

    reads_rows = True  # batch norm's statistics over each client's real rows

    KIND = "cnn4"

    #: batch norm's momentum and epsilon (PyTorch's defaults)
    BN_MOMENTUM, BN_EPS = 0.1, 1e-5

    def __init__(self, input_shape: Sequence[int], n_classes: int, batch_norm: bool = False):
        super().__init__(input_shape, n_classes)
        self.batch_norm = batch_norm
        h, w, c = self.h, self.w, self.c
        self.pad1 = 0 if min(h, w) >= 28 else 2
        s = (min(h, w) - 4 + 2 * self.pad1) // 2
        self.pad2 = 0 if s >= 10 else 2
        s = (s - 4 + 2 * self.pad2) // 2
        flat = 64 * s * s
        self._specs = [
            ParamSpec("conv1.weight", (32, c, 5, 5), fan_in_init(c * 25)),
            ParamSpec("conv1.bias", (32,), fan_in_init(c * 25)),
            ParamSpec("conv2.weight", (64, 32, 5, 5), fan_in_init(32 * 25)),
            ParamSpec("conv2.bias", (64,), fan_in_init(32 * 25)),
            ParamSpec("fc1.weight", (512, flat), fan_in_init(flat)),
            ParamSpec("fc1.bias", (512,), fan_in_init(flat)),
            ParamSpec("fc.weight", (n_classes, 512), fan_in_init(512)),
            ParamSpec("fc.bias", (n_classes,), fan_in_init(512)),
        ]
        if batch_norm:  # after conv1, conv2 and fc1, before the ReLU (FedBN's models)
            for name, width in (("bn1", 32), ("bn2", 64), ("bn3", 512)):
                self._specs += [ParamSpec(f"{name}.weight", (width,), ones_init),
                                ParamSpec(f"{name}.bias", (width,), zeros_init),
                                ParamSpec(f"{name}.running_mean", (width,), zeros_init, buffer=True),
                                ParamSpec(f"{name}.running_var", (width,), ones_init, buffer=True)]

    @property
    def head_names(self) -> tuple[str, ...]:
        return ("fc.weight", "fc.bias")
    @property
    def latent_dim(self) -> int:
        return 512

    def _features_one(self, p: Params, x: torch.Tensor) -> torch.Tensor:
        if self.batch_norm:
            return self._features_bn(p, x, None, {})
        return F.relu(F.linear(self._convolved(p, x), p["fc1.weight"], p["fc1.bias"]))

    def _bn(self, p: Params, name: str, h: torch.Tensor, rows: int | None,
            updates: dict[str, torch.Tensor]) -> torch.Tensor:
        """Batch norm of one client's batch ``h`` [b, C, …]: its real ``rows``' statistics while training
        (and the running statistics' new values into ``updates``), the running statistics at evaluation."""
        if rows is None:
            mean, var = p[f"{name}.running_mean"], p[f"{name}.running_var"]
        else:
            real = h[:rows].transpose(0, 1).reshape(h.shape[1], -1)  # [C, rows × spatial]
            mean, var = real.mean(1), real.var(1, unbiased=False)
            count = real.shape[1]
            m = self.BN_MOMENTUM
            unbiased = var.detach() * count / max(count - 1, 1)
            updates[f"{name}.running_mean"] = (1 - m) * p[f"{name}.running_mean"] + m * mean.detach()
            updates[f"{name}.running_var"] = (1 - m) * p[f"{name}.running_var"] + m * unbiased
        shape = (1, -1) + (1,) * (h.dim() - 2)
        norm = (h - mean.view(shape)) / torch.sqrt(var.view(shape) + self.BN_EPS)
        return norm * p[f"{name}.weight"].view(shape) + p[f"{name}.bias"].view(shape)

    def _features_bn(self, p: Params, x: torch.Tensor, rows: int | None,
                     updates: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.c == 1:
            x = x.reshape(-1, 1, self.h, self.w)
        else:
            x = x.reshape(-1, self.h, self.w, self.c).permute(0, 3, 1, 2)
        x = F.conv2d(x, p["conv1.weight"], p["conv1.bias"], padding=self.pad1)
        x = F.relu(_pool(self._bn(p, "bn1", x, rows, updates)))
        x = F.conv2d(x, p["conv2.weight"], p["conv2.bias"], padding=self.pad2)
        x = F.relu(_pool(self._bn(p, "bn2", x, rows, updates))).flatten(1)
        return F.relu(self._bn(p, "bn3", F.linear(x, p["fc1.weight"], p["fc1.bias"]), rows, updates))

    def features(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        """With batch norm, the training forward's own (each client's batch statistics, the running statistics'
        new values into ``noise.updates``) when ``noise`` is given: a method that trains through ``features``
        and ``head`` (MOON, FedRoD, FedProto, FedGen) trains the same network as the plain forward."""
        if not self.batch_norm:
            return super().features(params, x, noise)
        out, new = [], []
        for i, p in enumerate(_clients(params)):  # per client: its own batch statistics (a loop on every device)
            updates: dict[str, torch.Tensor] = {}
            out.append(self._features_bn(p, x[i], max(int(noise.rows[i]), 1) if noise is not None else None, updates))
            # a client without rows this step keeps its running statistics
            new.append({k: v if noise is not None and noise.rows[i] else p[k] for k, v in updates.items()})
        if noise is not None and new and new[0]:
            noise.updates.update({k: torch.stack([u[k] for u in new]) for k in new[0]})
        return torch.stack(out)

    def forward(self, params: Params, x: torch.Tensor, noise: Noise | None = None) -> torch.Tensor:
        if not self.batch_norm:
            return super().forward(params, x, noise)
        return self.head(params, self.features(params, x, noise))

    def activation_floats(self, batch: int) -> int:
        return 3 * batch * (32 * self.h * self.w + 64 * self.h * self.w // 4 + 512)
