"""A tiny labelled dataset for algorithm tests: class c's inputs are N(c, 1) in every feature."""

from __future__ import annotations

import numpy as np


class ShiftedGaussians:
    """What ``make_federation`` needs: train and test arrays, the class count and the input shape."""

    def __init__(self, n: int = 300, d: int = 4, classes: int = 3, seed: int = 0, test_per_class: int = 10):
        rng = np.random.default_rng(seed)
        self.y_train = rng.integers(0, classes, n)
        self.x_train = (rng.normal(size=(n, d)) + self.y_train[:, None]).astype(np.float32)
        self.y_test = np.repeat(np.arange(classes), test_per_class)
        self.x_test = (rng.normal(size=(len(self.y_test), d)) + self.y_test[:, None]).astype(np.float32)
        self.n_classes = classes
        self.input_shape = (d,)
