"""YAMNet in torch: the log-mel front end as published and the MobileNet-v1 body, for ``embed.kind: yamnet``.

The CGAU paper embeds FSD Kaggle 2018 clips with YAMNet (Plakal & Ellis, Google,
``tensorflow/models/research/audioset/yamnet``): 1024-d embeddings, one per
0.96 s patch, max-pooled over a clip's patches, remainders dropped. This module
re-implements the published model so no TensorFlow is needed:

- front end (``features.py``, ``params.py``): 16 kHz mono; |STFT| with a 25 ms
  periodic Hann window (400 samples), 10 ms hop (160), FFT 512 (257 bins);
  a 64-band mel matrix over 125–7500 Hz (HTK mel scale, TensorFlow's
  ``linear_to_mel_weight_matrix``: triangles in the mel domain, the DC bin
  zeroed); ``log(mel + 0.001)``; patches of 96 frames (0.96 s), hop 48 (0.48 s).
  Frames and patches without padding at the end: the remainder of a clip that
  does not fill a frame or a patch is dropped, as the paper says (YAMNet itself
  pads the end). A clip shorter than one patch is zero-padded to one.
- body (``yamnet.py``): a 3×3 convolution (stride 2, 32) and 13 depthwise-
  separable blocks (64, 128/2, 128, 256/2, 256, 512/2, 512 ×5, 1024/2, 1024),
  each convolution followed by batch norm (ε = 1e-4, centre only, no scale) and
  ReLU, TensorFlow's ``same`` padding (asymmetric at stride 2); global average
  pooling → the 1024-d embedding (the 521-class AudioSet logits are not used).

Weights cannot be downloaded here: ``embed.weights`` names a file the user
supplies — the published Keras checkpoint ``yamnet.h5`` (read with h5py) or a
torch state dict converted from it (:func:`convert`; the README's Data section says how).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from hetfed.errors import ConfigError, MissingExtraError

SAMPLE_RATE = 16_000
WINDOW = 400  # 0.025 s
HOP = 160  # 0.010 s
FFT = 512
MEL_BANDS = 64
MEL_MIN_HZ, MEL_MAX_HZ = 125.0, 7500.0
LOG_OFFSET = 0.001
PATCH_FRAMES = 96  # 0.96 s
PATCH_HOP = 48  # 0.48 s
BN_EPS = 1e-4
EMBEDDING = 1024
#: (kind, stride, filters) of the 14 layers, as in yamnet.py's _YAMNET_LAYER_DEFS (all kernels 3×3)
LAYERS = [("conv", 2, 32), ("sep", 1, 64), ("sep", 2, 128), ("sep", 1, 128), ("sep", 2, 256), ("sep", 1, 256),
          ("sep", 2, 512)] + [("sep", 1, 512)] * 5 + [("sep", 2, 1024), ("sep", 1, 1024)]


# --- front end ----------------------------------------------------------------------------------------------

def _hz_to_mel(hz: np.ndarray) -> np.ndarray:
    return 1127.0 * np.log1p(hz / 700.0)


def mel_matrix() -> np.ndarray:
    """``[257, 64]`` TensorFlow's ``linear_to_mel_weight_matrix(64, 257, 16000, 125, 7500)``."""
    bins = FFT // 2 + 1
    freqs = np.linspace(0.0, SAMPLE_RATE / 2, bins)[1:]  # TF drops the DC bin (its row stays 0)
    mel = _hz_to_mel(freqs)[:, None]
    edges = np.linspace(_hz_to_mel(np.array(MEL_MIN_HZ)), _hz_to_mel(np.array(MEL_MAX_HZ)), MEL_BANDS + 2)
    lower, centre, upper = edges[:-2], edges[1:-1], edges[2:]
    weights = np.maximum(0.0, np.minimum((mel - lower) / (centre - lower), (upper - mel) / (upper - centre)))
    return np.vstack([np.zeros((1, MEL_BANDS)), weights]).astype(np.float32)


def frame_count(n_samples: int) -> int:
    """STFT frames of a clip (no padding: a partial frame at the end is dropped)."""
    return 0 if n_samples < WINDOW else 1 + (n_samples - WINDOW) // HOP


def patch_count(n_samples: int) -> int:
    """0.96 s patches of a clip (a partial patch at the end is dropped; a short clip is padded to one)."""
    frames = frame_count(max(n_samples, min_samples()))
    return 1 + (frames - PATCH_FRAMES) // PATCH_HOP


def min_samples() -> int:
    """The shortest clip that fills one patch: 0.975 s (96 frames)."""
    return WINDOW + (PATCH_FRAMES - 1) * HOP


def log_mel_patches(waveform: np.ndarray) -> torch.Tensor:
    """``[patches, 96, 64]`` log-mel patches of a 16 kHz mono waveform in [−1, 1]."""
    wave = torch.as_tensor(np.asarray(waveform, dtype=np.float32))
    if len(wave) < min_samples():
        wave = F.pad(wave, (0, min_samples() - len(wave)))
    window = torch.hann_window(WINDOW, periodic=True)
    frames = wave.unfold(0, WINDOW, HOP) * window  # [frames, 400]: tf.signal.stft without pad_end
    magnitude = torch.fft.rfft(frames, n=FFT).abs()  # [frames, 257]
    log_mel = torch.log(magnitude @ torch.from_numpy(mel_matrix()) + LOG_OFFSET)
    return log_mel.unfold(0, PATCH_FRAMES, PATCH_HOP).transpose(1, 2).contiguous()  # [patches, 96, 64]


# --- body -------------------------------------------------------------------------------------------------

def param_shapes() -> dict[str, tuple[int, ...]]:
    """Every tensor of the body in torch layout (conv weights ``[out, in/groups, 3, 3]``; BN without γ)."""
    shapes: dict[str, tuple[int, ...]] = {}
    channels = 1
    for i, (kind, _stride, filters) in enumerate(LAYERS, start=1):
        convs = [("conv", (filters, channels, 3, 3))] if kind == "conv" else [
            ("depthwise_conv", (channels, 1, 3, 3)), ("pointwise_conv", (filters, channels, 1, 1))]
        for name, shape in convs:
            shapes[f"layer{i}.{name}.weight"] = shape
            for stat in ("beta", "moving_mean", "moving_variance"):
                shapes[f"layer{i}.{name}.bn.{stat}"] = (shape[0],)
        channels = filters
    return shapes


def random_weights(seed: int = 0) -> dict[str, torch.Tensor]:
    """Untrained weights of the right shapes (tests; never for results)."""
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in param_shapes().items():
        if name.endswith("moving_variance"):
            out[name] = torch.rand(shape, generator=gen) + 0.5
        elif name.endswith((".beta", "moving_mean")):
            out[name] = torch.randn(shape, generator=gen) * 0.1
        else:
            out[name] = torch.randn(shape, generator=gen) * math.sqrt(2.0 / math.prod(shape[1:]))
    return out


def _same(x: torch.Tensor, stride: int) -> torch.Tensor:
    """TensorFlow's ``same`` padding for a 3×3 kernel: at stride 2 the extra row/column goes at the end."""
    pads = []
    for size in (x.shape[-1], x.shape[-2]):
        total = max((math.ceil(size / stride) - 1) * stride + 3 - size, 0)
        pads += [total // 2, total - total // 2]
    return F.pad(x, pads)


def _bn_relu(x: torch.Tensor, w: dict[str, torch.Tensor], prefix: str) -> torch.Tensor:
    mean, var, beta = (w[f"{prefix}.bn.{k}"][:, None, None] for k in ("moving_mean", "moving_variance", "beta"))
    return F.relu((x - mean) / torch.sqrt(var + BN_EPS) + beta)


def embed_patches(patches: torch.Tensor, weights: dict[str, torch.Tensor]) -> torch.Tensor:
    """``[P, 96, 64]`` log-mel patches → ``[P, 1024]`` embeddings (inference: BN with moving statistics)."""
    x = patches.unsqueeze(1)  # [P, 1, 96, 64]
    for i, (kind, stride, _filters) in enumerate(LAYERS, start=1):
        if kind == "conv":
            x = _bn_relu(F.conv2d(_same(x, stride), weights[f"layer{i}.conv.weight"], stride=stride), weights,
                         f"layer{i}.conv")
            continue
        x = F.conv2d(_same(x, stride), weights[f"layer{i}.depthwise_conv.weight"], stride=stride, groups=x.shape[1])
        x = _bn_relu(x, weights, f"layer{i}.depthwise_conv")
        x = _bn_relu(F.conv2d(x, weights[f"layer{i}.pointwise_conv.weight"]), weights, f"layer{i}.pointwise_conv")
    return x.mean(dim=(2, 3))


def clip_embedding(waveform: np.ndarray, weights: dict[str, torch.Tensor]) -> np.ndarray:
    """A clip's 1024-d embedding: the maximum over its patches' embeddings."""
    with torch.inference_mode():
        return embed_patches(log_mel_patches(waveform), weights).amax(0).numpy()


# --- weights ----------------------------------------------------------------------------------------------

HOW_TO_GET = ("download the published Keras weights yamnet.h5 (https://storage.googleapis.com/audioset/yamnet.h5, "
              "linked from tensorflow/models research/audioset/yamnet) and set embed.weights to that file "
              "(reading .h5 needs h5py: pip install 'hetfed[audio]'), or convert it once with "
              "`python -m hetfed.data.yamnet yamnet.h5 yamnet.pt` and set embed.weights to yamnet.pt")


def load_weights(path: str | None) -> dict[str, torch.Tensor]:
    """The body's weights from ``embed.weights`` (.h5 or a converted .pt), checked against the architecture."""
    if not path:
        raise ConfigError(f"embed.weights is not set: embed.kind = 'yamnet' needs YAMNet's weights; {HOW_TO_GET}")
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(f"embed.weights = {path!r} is not a file: expected YAMNet's weights; {HOW_TO_GET}")
    weights = from_keras_h5(file) if file.suffix == ".h5" else torch.load(file, map_location="cpu", weights_only=True)
    expected = param_shapes()
    wrong = [k for k, s in expected.items() if k not in weights or tuple(weights[k].shape) != s]
    if wrong:
        raise ConfigError(f"embed.weights = {path!r} does not hold YAMNet's body: {len(wrong)} tensors missing or "
                          f"misshapen (first: {wrong[0]!r}, expected shape {expected[wrong[0]]}); {HOW_TO_GET}")
    return {k: weights[k].float() for k in expected}


def from_keras_h5(path: Path) -> dict[str, torch.Tensor]:
    """YAMNet's Keras checkpoint → torch names and layouts.

    Keras names ``layerN/conv/kernel:0`` (``[3, 3, in, out]``),
    ``layerN/depthwise_conv/depthwise_kernel:0`` (``[3, 3, in, 1]``),
    ``layerN/pointwise_conv/kernel:0`` (``[1, 1, in, out]``) and
    ``layerN/<conv>/bn/{beta,moving_mean,moving_variance}:0``.
    """
    try:
        import h5py
    except ImportError:
        raise MissingExtraError(f"embed.weights = {str(path)!r} is a Keras .h5 file: reading it needs h5py: "
                                "pip install 'hetfed[audio]'") from None
    found: dict[str, np.ndarray] = {}
    with h5py.File(path, "r") as f:
        f.visititems(lambda name, obj: found.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    out = {}
    for name, value in found.items():
        parts = [p for p in name.replace(":0", "").split("/") if p]
        layer = next((i for i, p in enumerate(parts) if p.startswith("layer") and p[5:].isdigit()), None)
        if layer is None or layer + 2 >= len(parts):
            continue  # the logits layer, optimiser state, …
        conv, last = parts[layer + 1], parts[-1]
        key = f"{parts[layer]}.{conv}"
        if parts[-2] == "bn" and last in ("beta", "moving_mean", "moving_variance"):
            out[f"{key}.bn.{last}"] = torch.from_numpy(np.asarray(value))
        elif last == "depthwise_kernel":
            out[f"{key}.weight"] = torch.from_numpy(np.asarray(value)).permute(2, 3, 0, 1).contiguous()
        elif last == "kernel":
            out[f"{key}.weight"] = torch.from_numpy(np.asarray(value)).permute(3, 2, 0, 1).contiguous()
    return out


def convert(h5: str, out: str) -> None:
    """Save the body of ``yamnet.h5`` as a torch state dict (no h5py needed afterwards)."""
    torch.save(load_weights(h5), out)


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 3:
        sys.exit("usage: python -m hetfed.data.yamnet yamnet.h5 yamnet.pt")
    convert(sys.argv[1], sys.argv[2])
