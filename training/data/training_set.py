"""Harder tasks from the same data: a smaller stratified training subset, symmetric label noise.

Both are deterministic in ``seed``. The subset cuts the training split only. Label noise changes labels in every split,
as when the annotation itself is noisy: the noisy labels are then the data distribution that a calibrated model's
confidence must match. Noising the training split alone would grade the model against other labels than it was trained
on, and every method would look under-confident for that reason alone.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from .dataset import DataSplits, ImageDataset
from .splits import _split_off


def subsample_train(splits: DataSplits, size: int, seed: int = 0) -> DataSplits:
    """``splits`` with a stratified random subset of ``size`` training images.

    >>> from training.data import load_digits_splits
    >>> small = subsample_train(load_digits_splits(), 200)
    >>> len(small.train), int(np.bincount(small.train.y).min()), int(np.bincount(small.train.y).max())
    (200, 19, 21)
    """
    n = len(splits.train)
    if not splits.num_classes <= size <= n:
        raise ValueError(f"train_size must lie in [{splits.num_classes}, {n}] (an image per class at least), "
                         f"got {size}")
    if size == n:
        return splits
    keep, _ = _split_off(np.arange(n, dtype=np.int64), splits.train.y, n - size, seed)
    return replace(splits, train=splits.train.subset(np.sort(keep)))


def with_label_noise(splits: DataSplits, rate: float, seed: int = 0) -> DataSplits:
    """``splits`` with symmetric label noise in every split: in each, round(rate * N) images drawn at
    random get a label drawn uniformly from the K - 1 other classes (symmetric noise as in Patrini et
    al. 2017, with every drawn label changed, so exactly that fraction of each split is wrong).

    >>> from training.data import load_digits_splits
    >>> clean = load_digits_splits()
    >>> noisy = with_label_noise(clean, 0.3)
    >>> [round(float(np.mean(getattr(noisy, s).y != getattr(clean, s).y)), 3) for s in ("train", "val", "test")]
    [0.3, 0.301, 0.301]
    """
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"label_noise must lie in [0, 1), got {rate}")
    rng = np.random.default_rng(seed)
    k = splits.num_classes

    def noisy(part: ImageDataset) -> ImageDataset:
        flipped = rng.choice(len(part), size=int(round(rate * len(part))), replace=False)
        y = part.y.copy()
        y[flipped] = (y[flipped] + rng.integers(1, k, size=len(flipped))) % k
        return ImageDataset(x=part.x, y=y, class_names=part.class_names)

    return replace(splits, train=noisy(splits.train), val=noisy(splits.val), test=noisy(splits.test))
