"""What the MNIST-like datasets share: the four IDX files of a folder."""

from __future__ import annotations

from collections.abc import Callable

from hetfed.config import DatasetConfig
from hetfed.data.loading import Dataset, file_record, find_folder, load_idx_pair, verify_packaged


def load_mnist_like(name: str, class_names: tuple[str, ...] = ()) -> Callable[[DatasetConfig], Dataset]:
    files = [
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ]

    def load(cfg: DatasetConfig) -> Dataset:
        folder = find_folder(name, cfg.data_dir, files)
        verify_packaged(name, folder)
        x_tr, y_tr, p_tr = load_idx_pair(folder, "train")
        x_te, y_te, p_te = load_idx_pair(folder, "t10k")
        sources = tuple(file_record(p) for p in p_tr + p_te)
        return Dataset(name, x_tr, y_tr, x_te, y_te, 10, "image", sources=sources, class_names=class_names)

    load.__doc__ = f"{name}: the standard IDX files from a folder."
    return load
