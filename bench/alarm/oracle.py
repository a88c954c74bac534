"""The oracle a miscalibration detector is measured against: a CUSUM told the shift in advance.

A detector sees only the top-label confidence C and the outcome Y, so what it can learn of a shift is
a(C) = E[Y | C], the accuracy at each confidence. The oracle knows a(C) and runs Page's (1954) CUSUM of
the log-likelihood ratio of that shift against the nearest point of the null band |E[Y | C] - C| <= eps,

    x_t = log Bern(Y_t; a(C_t)) / Bern(Y_t; e(C_t)),   e(C) = clip(a(C), C - eps, C + eps),

(0 where a(C) lies inside the band), and for clearing the ratio of calibrated outcomes against the
shift, log Bern(Y; C) / Bern(Y; a(C)). Its level is not a formula but the one that, on simulated traffic
of the same confidences, raises at most the allowed share of false alarms (``tuned_level``): the yardstick
for a detector that must learn a(C) from the labels, at the same false-alarm rate on the same streams.

    >>> import numpy as np
    >>> x = np.array([[1.0, -3.0, 2.0, 2.0]])
    >>> cusum_paths(x).tolist()
    [[1.0, -2.0, 2.0, 4.0]]
    >>> first_crossing(cusum_paths(x), 3.0, start=0).tolist()
    [3]
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

_LOG_EDGE = 1e-6  # keeps log Bern finite, no more: the oracle is told a(C), the detector clips at its _BET_EDGE


@dataclass(frozen=True)
class AccuracyCurve:
    """a(C) = E[Y | C] as a step function over quantile bins of the confidence."""

    edges: np.ndarray
    values: np.ndarray

    @classmethod
    def fit(cls, confidence: np.ndarray, accuracy: np.ndarray, bins: int = 1_000) -> AccuracyCurve:
        """From a large sample of confidences and their true accuracies P(Y = 1 | prediction): the mean
        accuracy of each of ``bins`` equally filled bins of the confidence (ties share one bin).

        >>> c = np.linspace(0.5, 1.0, 10_000)
        >>> curve = AccuracyCurve.fit(c, c - 0.1, bins=100)
        >>> bool(np.allclose(curve(np.array([0.6, 0.9])), [0.5, 0.8], atol=0.005))
        True
        """
        c, a = np.ravel(confidence), np.ravel(accuracy)
        edges = np.unique(np.quantile(c, np.linspace(0, 1, bins + 1)[1:-1]))
        index = np.searchsorted(edges, c, side="right")
        counts = np.bincount(index, minlength=len(edges) + 1)
        values = np.bincount(index, weights=a, minlength=len(edges) + 1) / np.maximum(counts, 1)
        return cls(edges, values)

    def __call__(self, confidence: np.ndarray) -> np.ndarray:
        return self.values[np.searchsorted(self.edges, confidence, side="right")]


def log_ratio(y: np.ndarray, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """log Bern(y; p) / Bern(y; q), elementwise."""
    p, q = np.clip(p, _LOG_EDGE, 1 - _LOG_EDGE), np.clip(q, _LOG_EDGE, 1 - _LOG_EDGE)
    return np.where(y > 0.5, np.log(p / q), np.log((1 - p) / (1 - q)))


def nearest_edge(confidence: np.ndarray, accuracy: np.ndarray, tolerance: float) -> np.ndarray:
    """e(C): the point of the null band [C - eps, C + eps] nearest to the accuracy a(C)."""
    return np.clip(accuracy, confidence - tolerance, confidence + tolerance)


def detection_increments(confidence, correct, curve: AccuracyCurve, tolerance: float) -> np.ndarray:
    """x_t of the module docstring: evidence for the shift a(C) against the nearest edge of the null."""
    a = curve(confidence)
    return log_ratio(correct, a, nearest_edge(confidence, a, tolerance))


def scaled_accuracy(confidence: np.ndarray, accuracy: np.ndarray, size: float) -> np.ndarray:
    """The shift of the same shape as a curve but ``size`` times as large, C + size (a(C) - C), from the curve's
    ``accuracy`` a(C) at these confidences (computed once for all sizes: the curve's lookup is the dear part)."""
    return np.clip(confidence + size * (accuracy - confidence), _LOG_EDGE, 1 - _LOG_EDGE)


def scaled_curve_increments(confidence, correct, accuracy: np.ndarray, size: float, tolerance: float) -> np.ndarray:
    """x_t for the shift of the curve's shape (its ``accuracy`` at these confidences given), ``size`` times as large."""
    a = scaled_accuracy(confidence, accuracy, size)
    return log_ratio(correct, a, nearest_edge(confidence, a, tolerance))


def mixture_paths(paths: Iterable[np.ndarray]) -> np.ndarray:
    """log of the equally weighted mean of exp(S_t) over CUSUM paths of several alternatives: the statistic of a
    detector that knows the alternative is one of them, but not which. The paths are consumed one at a time,
    so a generator of many paths needs the memory of two.

    >>> bool(np.allclose(mixture_paths(iter([np.log([[1.0, 2.0]]), np.log([[3.0, 4.0]])])), np.log([[2.0, 3.0]])))
    True
    """
    top = total = None
    count = 0
    for path in paths:
        if top is None:
            top, total = np.array(path, dtype=np.float64), np.ones(np.shape(path))
        else:
            peak = np.maximum(top, path)
            total = total * np.exp(top - peak) + np.exp(path - peak)
            top = peak
        count += 1
    if top is None or total is None:
        raise ValueError("mixture_paths needs at least one path")
    return top + np.log(total / count)


def clearing_increments(confidence, correct, curve: AccuracyCurve) -> np.ndarray:
    """log Bern(Y; C) / Bern(Y; a(C)): evidence that the shift has ended and outcomes match the confidence."""
    return log_ratio(correct, confidence, curve(confidence))


def blind_clearing_paths(confidence, correct, curves: Sequence[AccuracyCurve], sizes: Sequence[float]) -> np.ndarray:
    """The clearing statistic of an oracle told that the shift began at the first label and is one of the K
    ``curves`` at one of ``sizes`` times its size, but not which: it learns which from the labels. With the
    Bayes factor of calibrated outcomes against the equally weighted mixture of the members since the shift began,

        M_t = log prod_{u <= t} Bern(Y_u; C_u) / mean_k prod_{u <= t} Bern(Y_u; a_k(C_u)),

    its increment is log Bern(Y_t; C_t) / sum_k w_k Bern(Y_t; a_k(C_t)), w_k the posterior of member k from the
    labels before t, and its CUSUM max_s (M_t - M_s) tests the labels of the current run against the members
    weighted by what the labels before the run said of them. One member is the clearing oracle:

    >>> rng = np.random.default_rng(0)
    >>> c = rng.uniform(0.5, 1.0, (3, 50))
    >>> y = (rng.random(c.shape) < c).astype(float)
    >>> curve = AccuracyCurve(np.array([0.75]), np.array([0.55, 0.8]))
    >>> bool(np.allclose(blind_clearing_paths(c, y, [curve], [1.0]), cusum_paths(clearing_increments(c, y, curve))))
    True
    """
    bayes = -mixture_paths(
        -np.cumsum(log_ratio(correct, confidence, scaled_accuracy(confidence, accuracy, size)), axis=-1)
        for accuracy in (curve(confidence) for curve in curves)
        for size in sizes
    )
    return cusum_paths(np.diff(bayes, axis=-1, prepend=0.0))


def cusum_paths(increments: np.ndarray) -> np.ndarray:
    """Page's CUSUM S_t = max(S_{t-1}, 0) + x_t, S_0 = 0, along the last axis, computed as
    W_t - min(0, min_{s < t} W_s) with W the running sum."""
    walk = np.cumsum(increments, axis=-1)
    floor = np.minimum.accumulate(np.concatenate([np.zeros(walk.shape[:-1] + (1,)), walk[..., :-1]], axis=-1), axis=-1)
    return walk - np.minimum(floor, 0.0)


def first_crossing(paths: np.ndarray, level: float, start: int) -> np.ndarray:
    """Per stream, labels from ``start`` to the first S_t >= level at or after it (-1: none)."""
    above = paths[:, start:] >= level
    if not above.shape[1]:
        return np.full(len(paths), -1)
    return np.where(above.any(axis=1), above.argmax(axis=1), -1)


def tuned_level(peaks: np.ndarray, rate: float) -> float:
    """The least level that at most a share ``rate`` of null streams reach, from ``peaks``, each stream's
    largest statistic: their (1 - rate) quantile, nudged above it.

    >>> tuned_level(np.arange(1.0, 101.0), 0.01) > 99.0
    True
    """
    return float(np.nextafter(np.quantile(peaks, 1.0 - rate, method="higher"), np.inf))


def never_as_infinite(delays: np.ndarray) -> np.ndarray:
    """Delays with a stream that never crossed (-1) as infinitely late."""
    return np.where(delays >= 0, delays, np.inf)


def unconditional_median(delays: np.ndarray) -> float:
    """The median delay with every stream counted, one that never crossed (-1) as infinitely late."""
    return float(np.median(never_as_infinite(delays))) if len(delays) else float("nan")
