"""Bootstrap confidence intervals for any metric of ``calibkit.metrics``.

Rows (prediction, label) are resampled with replacement, the metric is recomputed on each
resample, and the percentile interval of those values is reported (Efron & Tibshirani 1993,
Ch. 13). scipy.stats.bootstrap does the resampling over row indices, which keeps each prediction
paired with its label and bounds memory by resampling in batches.

``hierarchical_bootstrap`` does the same for a mean over several runs (e.g. training seeds), each
with its own rows: runs are resampled, then rows within each run (Davison & Hinkley 1997, Sec. 3.8).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import scipy  # its submodules load on first use (scipy.stats): serving starts without them

from calibkit.validation import check_int, check_probs_labels, check_unit, expected

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
    """A bootstrap confidence interval of ``metric(probs, labels)``, resampling the rows.

    ``"percentile"``: [q_{(1-level)/2}, q_{(1+level)/2}] of the metric over ``n_resamples`` resamples of the
    rows. ``"basic"`` reflects those quantiles around the estimate theta, (2 theta - q_hi, 2 theta - q_lo), which
    corrects a statistic's resampling bias; ``"BCa"`` is scipy's bias-corrected and accelerated interval (it needs
    N extra jackknife evaluations). Binned errors such as ECE are biased upwards on finite samples, so their
    percentile interval can lie entirely above the estimate. ``metric`` is a function of (probs, labels), e.g.
    ``calibkit.metrics.ece``; the same ``seed`` gives the same interval.

    References:
        Efron & Tibshirani 1993, "An Introduction to the Bootstrap", Ch. 13 (percentile) and 14 (BCa);
        Davison & Hinkley 1997, "Bootstrap Methods and their Application", Sec. 5.2 (basic).
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
    """``{name: ConfidenceInterval}`` of several metrics by name, in their order, as :func:`confidence_interval`
    gives each, from the same resamples (cheaper than one call per metric)."""
    p, y = check_probs_labels(probs, labels)
    if np.ndim(probs) == 1:
        p = p[:, 1]
    n_resamples = check_int("n_resamples", n_resamples, 1)
    if method not in ("percentile", "basic", "BCa"):
        raise ValueError(expected("method", "'percentile', 'basic' or 'BCa'", method))
    level = check_unit("level", level)
    if not metrics:
        raise ValueError(expected("metrics", "a mapping of at least one metric", dict(metrics)))
    functions = list(metrics.values())

    def statistic(idx: np.ndarray) -> np.ndarray:
        return np.array([f(p[idx], y[idx]) for f in functions])

    result = scipy.stats.bootstrap(
        (np.arange(len(y)),),
        statistic,
        vectorized=False,
        n_resamples=n_resamples,
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


@dataclass(frozen=True, eq=False)
class RunsBootstrap:
    """Every statistic on every run (``per_run``, shape (S, M)) and its mean over runs on each of the
    ``resampled`` draws (shape (R, M)); columns follow ``names``. See :func:`hierarchical_bootstrap`."""

    names: tuple[str, ...]
    per_run: np.ndarray
    resampled: np.ndarray

    def _weights(self, contrast: str | Mapping[str, float]) -> np.ndarray:
        contrast = {contrast: 1.0} if isinstance(contrast, str) else dict(contrast)
        unknown = sorted(set(contrast) - set(self.names))
        if unknown or not contrast:
            raise ValueError(f"unknown statistics {unknown}; known: {', '.join(self.names)}")
        return np.array([contrast.get(name, 0.0) for name in self.names], dtype=np.float64)

    def values(self, contrast: str | Mapping[str, float]) -> np.ndarray:
        """The (S,) per-run values of a statistic (by name) or of a contrast sum_j w_j stat_j (weights by name such
        as ``{"a": 1, "b": -1}``)."""
        return self.per_run @ self._weights(contrast)

    def mean(self, contrast: str | Mapping[str, float]) -> float:
        """The mean over runs of a statistic or contrast (the estimate :meth:`interval` brackets)."""
        return float(np.mean(self.values(contrast)))

    def sd(self, contrast: str | Mapping[str, float]) -> float:
        """The sample standard deviation over runs (ddof = 1) of a statistic or contrast; 0 for a single run."""
        values = self.values(contrast)
        return float(np.std(values, ddof=1)) if len(values) > 1 else 0.0

    def interval(
        self, contrast: str | Mapping[str, float], level: float = 0.90, method: str = "basic"
    ) -> ConfidenceInterval:
        """The bootstrap interval of :meth:`mean` at ``level``.

        ``"percentile"``: [q_lo, q_hi] of the resampled means; ``"basic"``: (2 theta - q_hi, 2 theta - q_lo),
        which corrects the upward resampling bias of binned errors.

        References:
            Davison & Hinkley 1997, "Bootstrap Methods and their Application", Sec. 5.2.
        """
        level = check_unit("level", level)
        if method not in ("percentile", "basic"):
            raise ValueError(expected("method", "'percentile' or 'basic'", method))
        estimate = self.mean(contrast)
        resampled = self.resampled @ self._weights(contrast)
        q_low, q_high = np.quantile(resampled, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
        if method == "basic":
            q_low, q_high = 2.0 * estimate - q_high, 2.0 * estimate - q_low
        return ConfidenceInterval(estimate, float(q_low), float(q_high), float(level))


def hierarchical_bootstrap(
    statistics: Mapping[str, Callable[[Mapping[str, np.ndarray]], float]],
    runs: Sequence[Mapping[str, np.ndarray]],
    n_resamples: int = 1000,
    seed: int | np.random.Generator | None = 0,
) -> RunsBootstrap:
    """A two-level bootstrap of the mean over S runs of each statistic: runs, then rows within each run.

    One resample draws S runs with replacement, then the rows of each drawn run with replacement, and averages
    each statistic over the drawn runs. Resampling runs carries the spread between runs (training seeds) into the
    interval, resampling rows the finite test set; doing both errs wide. Every statistic of a resample sees the
    same rows, so contrasts between methods scored on the same rows are paired.

    ``statistics`` maps names to functions of a run, e.g. ``lambda run: metrics.ece(run["ce"], run["labels"])``;
    each run is a mapping of row-aligned arrays (e.g. labels and the probabilities of several methods on the same
    test rows). Returns every statistic on every run and its mean over runs on each of the R = ``n_resamples``
    resamples; the same ``seed`` gives the same resamples.

    References:
        Davison & Hinkley 1997, "Bootstrap Methods and their Application", Sec. 3.8.
    """
    n_resamples = check_int("n_resamples", n_resamples, 1)
    if not statistics:
        raise ValueError(expected("statistics", "a mapping of at least one statistic", dict(statistics)))
    if not runs:
        raise ValueError(expected("runs", "a sequence of at least one run", list(runs)))
    sizes = []
    for i, run in enumerate(runs):
        lengths = {len(v) for v in run.values()}
        if len(lengths) != 1 or 0 in lengths:
            raise ValueError(
                f"Expected `runs[{i}]` to hold non-empty arrays of one length, but got lengths {sorted(lengths)}"
            )
        sizes.append(lengths.pop())
    functions = list(statistics.values())

    def evaluate(run: Mapping[str, np.ndarray]) -> np.ndarray:
        return np.array([f(run) for f in functions], dtype=np.float64)

    per_run = np.stack([evaluate(run) for run in runs])
    rng = np.random.default_rng(seed)
    resampled = np.empty((n_resamples, len(functions)))
    for r in range(n_resamples):
        values = []
        for s in rng.integers(0, len(runs), size=len(runs)):
            rows = rng.integers(0, sizes[s], size=sizes[s])
            values.append(evaluate({k: v[rows] for k, v in runs[s].items()}))
        resampled[r] = np.mean(values, axis=0)
    return RunsBootstrap(tuple(statistics), per_run, resampled)
