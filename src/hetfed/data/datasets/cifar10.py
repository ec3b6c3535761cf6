"""``cifar10``: CIFAR-10's "python version" batches (not reachable offline here; tested on written batches)."""

from __future__ import annotations

import numpy as np

from hetfed.config import DatasetConfig
from hetfed.data.datasets import DatasetKind, register
from hetfed.data.formats import read_cifar_batch
from hetfed.data.loading import Dataset, file_record, find_folder


def load_cifar10(cfg: DatasetConfig) -> Dataset:
    """CIFAR-10, the "python version" batches folder (data_batch_1..5, test_batch)."""
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    folder = find_folder("cifar10", cfg.data_dir, names)
    parts = [read_cifar_batch(folder / n) for n in names[:5]]
    x_te, y_te = read_cifar_batch(folder / "test_batch")
    x_tr = np.concatenate([p[0] for p in parts])
    y_tr = np.concatenate([p[1] for p in parts])
    scale = np.float32(1 / 255.0)
    sources = tuple(file_record(folder / n) for n in names)
    return Dataset("cifar10", x_tr.astype(np.float32) * scale, y_tr, x_te.astype(np.float32) * scale, y_te, 10, "image",
                   sources=sources)


register(DatasetKind(
    "cifar10", load_cifar10, "CIFAR-10: 50 000 + 10 000 colour images, 32×32, 10 classes", "image",
    places=("~/.cache/hetfed/datasets/cifar-10-batches-py", "~/data/cifar-10-batches-py"),
    how_to_get="download and unpack https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz "
    "(the folder cifar-10-batches-py)",
))
