"""Synthetic prediction sources with known calibration, for tests, simulations and demos.

Labels are drawn from softmax(z) itself, so softmax(z) is perfectly calibrated by construction;
reporting softmax(s * z) instead gives a source that is over-confident (s > 1) or under-confident
(s < 1) by exactly a temperature of s, which temperature scaling should recover.
"""

from __future__ import annotations

import numpy as np

from calibkit.temperature import softmax


def calibrated_logits(
    n: int, n_classes: int = 10, logit_scale: float = 3.0, seed: int | np.random.Generator | None = 0
) -> tuple[np.ndarray, np.ndarray]:
    """Logits z_i ~ N(0, logit_scale^2 I_K) and labels y_i ~ Categorical(softmax(z_i)).

    >>> z, y = calibrated_logits(4, n_classes=3, seed=1)
    >>> z.shape, y.shape, bool(np.all((0 <= y) & (y < 3)))
    ((4, 3), (4,), True)
    """
    if n < 1 or n_classes < 2:
        raise ValueError(f"need n >= 1 and n_classes >= 2, got n={n}, n_classes={n_classes}")
    rng = np.random.default_rng(seed)
    z = rng.normal(0.0, logit_scale, size=(n, n_classes))
    cumulative = np.cumsum(softmax(z), axis=1)
    u = rng.random((n, 1))
    labels = np.minimum((u > cumulative).sum(axis=1), n_classes - 1)
    return z, labels.astype(np.int64)
