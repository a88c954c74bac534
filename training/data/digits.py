"""scikit-learn's bundled 8x8 handwritten digits (UCI optical digits test set), no download."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from sklearn.datasets import load_digits

from .dataset import DataSplits, ImageDataset
from .splits import DEFAULT_FRACTIONS, stratified_split

DIGIT_CLASS_NAMES = tuple(str(d) for d in range(10))


def load_digits_splits(seed: int = 0, fractions: Sequence[float] = DEFAULT_FRACTIONS) -> DataSplits:
    """1797 images as float32 (N, 1, 8, 8) = pixel count / 16, split stratified and deterministically."""
    bunch = load_digits()
    x = (np.asarray(bunch.images, dtype=np.float32) / np.float32(16.0))[:, None, :, :]
    y = np.asarray(bunch.target, dtype=np.int64)
    full = ImageDataset(x=np.ascontiguousarray(x), y=y, class_names=DIGIT_CLASS_NAMES)
    train, val, test = stratified_split(y, fractions=fractions, seed=seed)
    return DataSplits(train=full.subset(train), val=full.subset(val), test=full.subset(test), name="digits")
