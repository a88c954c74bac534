"""Synthetic prediction sources with known calibration, for tests, simulations and demos (the benchmarks and the
test suite share them).

Labels are drawn from softmax(z) itself, so softmax(z) is perfectly calibrated by construction;
reporting softmax(s * z) instead gives a source that is over-confident (s > 1) or under-confident
(s < 1) by exactly a temperature of s, which temperature scaling should recover.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from calibkit import binning
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
    z, labels = TrafficShape("calibrated", n_classes, logit_scale).logits(np.random.default_rng(seed), (n,))
    return z, labels.astype(np.int64)


def top_label_outcomes(probs: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(top-label confidence, 1[top label is right]) of each row of ``probs`` (any leading axes)."""
    predicted = probs.argmax(axis=-1)
    confidence = np.take_along_axis(probs, predicted[..., None], axis=-1)[..., 0]
    return confidence, (predicted == labels).astype(np.float64)


@dataclass(frozen=True)
class TrafficShape:
    """A calibrated prediction source: logits z ~ N(0, logit_scale^2 I_K), plus ``class_offset`` on
    class 0's logit (a label mix other than uniform), and labels drawn from softmax(z), so softmax(z)
    is calibrated whatever the confidence distribution, class count or label mix.

    >>> c, y = TrafficShape("binary", 2, 3.0).sample(np.random.default_rng(0), (2, 5))
    >>> c.shape, bool(np.all((c >= 0.5) & (c <= 1)))
    ((2, 5), True)
    """

    name: str
    n_classes: int
    logit_scale: float
    class_offset: float = 0.0

    def logits(self, rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Logits of ``shape`` predictions and their labels."""
        z = rng.normal(0.0, self.logit_scale, size=(*shape, self.n_classes))
        z[..., 0] += self.class_offset
        cumulative = np.cumsum(softmax(z), axis=-1)
        labels = np.minimum((rng.random((*shape, 1)) > cumulative).sum(axis=-1), self.n_classes - 1)
        return z, labels

    def sample(self, rng: np.random.Generator, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Calibrated (confidence, correct) of ``shape`` predictions."""
        z, labels = self.logits(rng, shape)
        return top_label_outcomes(softmax(z), labels)


@dataclass(frozen=True)
class Miscalibration:
    """A way predictions stop matching outcomes, applied to a ``TrafficShape``:

    - ``logit_scale`` s: the served probabilities are softmax(s z) (s > 1 over-, s < 1 under-confident);
    - ``gap`` g with ``pivot``: the top-label outcome is drawn with probability C + g below the pivot
      confidence and C - g above it (``mean_preserving``), or C - g everywhere;
    - ``only_class`` k: only predictions of class k are served with softmax(s z).

    ``expected_accuracy`` returns the true P(correct) of every prediction, from which the population
    ECE is computed exactly rather than estimated.
    """

    name: str
    logit_scale: float = 1.0
    gap: float = 0.0
    mean_preserving: bool = False
    pivot: float = 0.5
    only_class: int | None = None

    def sample(
        self, shape_: TrafficShape, rng: np.random.Generator, shape: tuple[int, ...], strength: np.ndarray | float = 1.0
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(served confidence, correct, true accuracy) of ``shape`` predictions; ``strength`` in [0, 1]
        (broadcast against ``shape``) blends from calibrated (0) to this miscalibration (1), for ramps."""
        z, labels = shape_.logits(rng, shape)
        calibrated = softmax(z)
        strength = np.broadcast_to(np.asarray(strength, dtype=np.float64), shape)
        scale = 1.0 + (self.logit_scale - 1.0) * strength
        served = softmax(z * scale[..., None])
        if self.only_class is not None:
            keep = calibrated.argmax(axis=-1) != self.only_class
            served[keep] = calibrated[keep]
        confidence, correct = top_label_outcomes(served, labels)
        accuracy = np.take_along_axis(calibrated, served.argmax(axis=-1)[..., None], axis=-1)[..., 0]
        if self.gap:
            sign = np.where(confidence > self.pivot, -1.0, 1.0) if self.mean_preserving else -1.0
            accuracy = np.clip(confidence + sign * self.gap * strength, 0.0, 1.0)
            correct = (rng.random(shape) < accuracy).astype(np.float64)
        return confidence, correct, accuracy


def population_ece(confidence: np.ndarray, accuracy: np.ndarray, n_bins: int = 15) -> float:
    """ECE of a large sample whose true accuracies are known: sum_b P(b) |E[accuracy | b] - E[C | b]|
    over 15 equal-width bins (Guo et al. 2017), without the sampling noise of observed outcomes."""
    sums = binning.bin_sums(confidence.ravel(), accuracy.ravel(), binning.equal_width_edges(n_bins))
    return binning.calibration_error(sums, "l1")


def draw(
    shape: TrafficShape,
    miscalibration: Miscalibration | None,
    streams: int,
    before: int,
    during: int = 0,
    after: int = 0,
    seed: int = 0,
    ramp: int = 0,
    flip: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """(confidence, correct), each (streams, before + during + after): ``before`` calibrated labels,
    ``during`` labels of ``miscalibration`` (reached linearly over the first ``ramp``; with ``flip``, a gap
    whose sign turns every ``flip`` labels), ``after`` calibrated."""
    rng = np.random.default_rng(seed)
    total = before + during + after
    strength = np.zeros(total)
    strength[before : before + during] = 1.0
    if ramp:
        strength[before : before + ramp] = np.linspace(0.0, 1.0, ramp)
    if flip:
        strength[before : before + during] *= np.where((np.arange(during) // flip) % 2 == 0, 1.0, -1.0)
    mis = miscalibration or Miscalibration("calibrated")
    confidence, correct, _ = mis.sample(shape, rng, (streams, total), strength[None, :])
    return confidence, correct
