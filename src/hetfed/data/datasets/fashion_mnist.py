"""``fashion-mnist``: Zalando's Fashion-MNIST, the four IDX files (Debian: dataset-fashion-mnist)."""

from __future__ import annotations

from hetfed.data.datasets import DatasetKind, register
from hetfed.data.datasets._idx import load_mnist_like

#: the labels' names as Zalando's README gives them, by class id (``dataset.keep_classes: [Shirt, Pullover, …]``)
CLASS_NAMES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag",
               "Ankle boot")

register(DatasetKind(
    "fashion-mnist", load_mnist_like("fashion-mnist", CLASS_NAMES),
    "Fashion-MNIST: 60 000 + 10 000 clothing images, 28×28", "image",
    places=("/usr/share/datasets/fashion-mnist", "~/.cache/hetfed/datasets/fashion-mnist", "~/data/fashion-mnist"),
    how_to_get="on Debian/Ubuntu: apt-get install dataset-fashion-mnist; or download the "
    "four *-ubyte.gz files from https://github.com/zalandoresearch/fashion-mnist",
))
