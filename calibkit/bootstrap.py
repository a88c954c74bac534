"""Bootstrap confidence intervals for any metric of ``calibkit.metrics``.

Rows (prediction, label) are resampled with replacement, the metric is recomputed on each
resample, and the percentile interval of those values is reported (Efron & Tibshirani 1993,
Ch. 13). scipy.stats.bootstrap does the resampling over row indices, which keeps each prediction
paired with its label and bounds memory by resampling in batches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import NamedTuple

import numpy as np
from scipy import stats

from calibkit.validation import check_probs_labels

_BATCH = 64


class ConfidenceInterval(NamedTuple):
    """A point estimate on the full data and the two-sided percentile bootstrap interval."""

    estimate: float
    low: float
    high: float
    level: float


def confidence_interval(
    metric: Callable[[np.ndarray, np.ndarray], float],
    probs,
    labels,
    n_resamples: int = 1000,
    level: float = 0.90,
    seed: int | np.random.Generator | None = 0,
    method: str = "percentile",
) -> ConfidenceInterval:
    """Bootstrap interval of ``metric(probs, labels)`` at the given ``level``.

    ``method="percentile"``: [q_{(1-level)/2}, q_{(1+level)/2}] of the metric over ``n_resamples``
    resamples of the rows. ``"basic"`` reflects those quantiles around the estimate
    (2 theta - q_hi, 2 theta - q_lo), which corrects a statistic's resampling bias; ``"BCa"`` is
    scipy's bias-corrected and accelerated interval (it needs N extra jackknife evaluations).
    Binned errors such as ECE are biased upwards on finite samples, so their percentile interval
    can lie entirely above the estimate. Deterministic for a fixed ``seed``.
    """
    return confidence_intervals({"metric": metric}, probs, labels, n_resamples, level, seed, method)["metric"]


def confidence_intervals(
    metrics: Mapping[str, Callable[[np.ndarray, np.ndarray], float]],
    probs,
    labels,
    n_resamples: int = 1000,
    level: float = 0.90,
    seed: int | np.random.Generator | None = 0,
    method: str = "percentile",
) -> dict[str, ConfidenceInterval]:
    """Intervals of several metrics from the same resamples (cheaper than one call per metric).

    Arguments as in :func:`confidence_interval`; returns ``{name: ConfidenceInterval}``.
    """
    p, y = check_probs_labels(probs, labels)
    if np.ndim(probs) == 1:
        p = p[:, 1]
    if isinstance(n_resamples, bool) or not isinstance(n_resamples, (int, np.integer)) or n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples!r}")
    if method not in ("percentile", "basic", "BCa"):
        raise ValueError(f"method must be 'percentile', 'basic' or 'BCa', got {method!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must be in (0, 1), got {level!r}")
    if not metrics:
        raise ValueError("metrics must name at least one metric")
    functions = list(metrics.values())

    def statistic(idx: np.ndarray) -> np.ndarray:
        return np.array([f(p[idx], y[idx]) for f in functions])

    result = stats.bootstrap(
        (np.arange(len(y)),),
        statistic,
        vectorized=False,
        n_resamples=int(n_resamples),
        confidence_level=level,
        method=method,
        rng=np.random.default_rng(seed),
        batch=_BATCH,
    )
    estimate = statistic(np.arange(len(y)))
    lows, highs = np.atleast_1d(result.confidence_interval.low), np.atleast_1d(result.confidence_interval.high)
    return {
        name: ConfidenceInterval(float(e), float(lo), float(hi), float(level))
        for name, e, lo, hi in zip(metrics, estimate, lows, highs)
    }
